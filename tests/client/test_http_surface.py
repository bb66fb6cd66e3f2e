"""dlock's HTTP stack uses urllib3 through its documented surface only: no private member of
urllib3's pools, connections or responses (`_get_conn`, `_put_conn`, `_new_conn`, ...), nor the
pool's undocumented `.pool` queue, is reached from dlock's code, and no `_name` is imported from
urllib3. What dlock needs from urllib3 goes through `urlopen`, `ConnectionCls`, `conn_kw`,
`is_connected`, `release_conn` and the other documented names."""

from __future__ import annotations

import ast
from pathlib import Path

from urllib3 import HTTPConnectionPool, HTTPSConnectionPool, PoolManager
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.response import BaseHTTPResponse, HTTPResponse

DLOCK = Path(__file__).resolve().parents[2] / "dlock"
URLLIB3_CLASSES = (
    HTTPConnectionPool,
    HTTPSConnectionPool,
    HTTPConnection,
    HTTPSConnection,
    BaseHTTPResponse,
    HTTPResponse,
    PoolManager,
)


def urllib3_private_names() -> set[str]:
    names = {
        name
        for cls in URLLIB3_CLASSES
        for name in dir(cls)
        if name.startswith("_") and not name.startswith("__")
    }
    pool = HTTPConnectionPool("127.0.0.1", 1)
    names |= {name for name in vars(pool) if name.startswith("_")}
    names |= {name for name in vars(HTTPConnection("127.0.0.1", 1)) if name.startswith("_")}
    return names | {"pool"}  # HTTPConnectionPool.pool: the idle queue, not documented


def own_names(tree: ast.AST) -> set[str]:
    """Attributes and methods a dlock module defines itself (`self.x = ...`, `def x`)."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
    return own


def test_the_check_knows_the_private_members_dlock_once_used():
    assert {"_get_conn", "_put_conn", "_new_conn", "pool"} <= urllib3_private_names()


def private_uses(path: Path, private: set[str]) -> list[str]:
    """Where a module that works with urllib3 reaches one of its private members."""
    tree = ast.parse(path.read_text(), str(path))
    mine = own_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in private and node.attr not in mine:
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("urllib3"):
            found += [
                f"{path.name}:{node.lineno} import {alias.name}"
                for alias in node.names
                if alias.name.startswith("_")
            ]
    return found


def uses_urllib3(path: Path) -> bool:
    return "urllib3" in path.read_text()


def test_the_check_finds_the_private_members_of_the_transport_it_replaced(tmp_path):
    old = tmp_path / "http.py"
    old.write_text(
        "from urllib3 import HTTPConnectionPool\n"
        "def lend(origin: HTTPConnectionPool):\n"
        "    conn = origin._get_conn()\n"
        "    origin._put_conn(conn)\n"
        "    return origin.pool.queue, origin._new_conn()\n"
    )
    assert private_uses(old, urllib3_private_names()) == [
        "http.py:3 ._get_conn",
        "http.py:4 ._put_conn",
        "http.py:5 .pool",
        "http.py:5 ._new_conn",
    ]


def test_dlock_reaches_no_private_urllib3_member():
    private = urllib3_private_names()
    modules = [path for path in sorted(DLOCK.rglob("*.py")) if uses_urllib3(path)]
    assert {"http.py", "http_connection.py"} <= {p.name for p in modules}
    found = [use for path in modules for use in private_uses(path, private)]
    assert found == []
