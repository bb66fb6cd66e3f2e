"""Generate lockserver/etcd_proto/ (etcd's gRPC stubs) from etcd's own .proto files.

`make etcd-stubs` runs this. The inputs are etcd's files as released (third_party/etcd/, tag and
commit in its README), never edited; this script copies them to a temporary tree with what only
etcd's Go build needs stripped — the gogoproto, google.api (the JSON gateway's routes),
protoc-gen-openapiv2 and versionpb annotations and their imports — and the imports re-rooted at
lockserver/etcd_proto/, then runs grpcio-tools' protoc (python, pyi and grpc_python outputs).
The output is deterministic: tests/lockserver/test_etcd_stubs.py regenerates it into a temporary
directory and compares it with the committed modules byte for byte.

    python scripts/etcd_stubs.py [--out DIR]    # DIR: the tree root to write under (default: .)
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "third_party" / "etcd"
PACKAGE = "lockserver/etcd_proto"
# etcd's path -> the file name under PACKAGE
PROTOS = {
    "api/mvccpb/kv.proto": "kv.proto",
    "api/authpb/auth.proto": "auth.proto",
    "api/etcdserverpb/rpc.proto": "rpc.proto",
    # etcd's lock service: bench.peers' etcd-lock arms only (the backend uses KV and leases)
    "server/etcdserver/api/v3lock/v3lockpb/v3lock.proto": "v3lock.proto",
}
SERVICES = ("rpc.proto", "v3lock.proto")
DROPPED_IMPORTS = (
    "gogoproto/gogo.proto",
    "google/api/annotations.proto",
    "protoc-gen-openapiv2/options/annotations.proto",
    "etcd/api/versionpb/version.proto",
)
INIT = '"""etcd\'s gRPC stubs, made by `make etcd-stubs` (scripts/etcd_stubs.py): never edit."""\n'


def _drop_option_statements(text: str) -> str:
    """Remove every `option (custom.name) = ...;` statement, a `{ ... }` literal included."""
    out: list[str] = []
    i = 0
    pattern = re.compile(r"option\s*\(")
    while True:
        match = pattern.search(text, i)
        if match is None:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i : match.start()])
        j = match.end()
        depth = 0
        while j < len(text):
            char = text[j]
            if char == '"':
                j = text.index('"', j + 1)
            elif char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
            elif char == ";" and depth == 0:
                break
            j += 1
        i = j + 1


def _drop_field_options(text: str) -> str:
    """Remove custom (parenthesised) entries of field option lists: `[(x.y) = "3.1"]`."""

    def keep(match: re.Match[str]) -> str:
        entries = [e.strip() for e in match.group(1).split(",")]
        kept = [e for e in entries if not e.startswith("(")]
        return f" [{', '.join(kept)}]" if kept else ""

    return re.sub(r"[ \t]*\[([^\]\n]*\([^\]\n]*)\]", keep, text)


def strip(text: str) -> str:
    """etcd's .proto text without the annotations protoc for Python cannot resolve."""
    lines = [
        line
        for line in text.splitlines()
        if not any(line.strip() == f'import "{name}";' for name in DROPPED_IMPORTS)
    ]
    text = "\n".join(lines) + "\n"
    text = _drop_option_statements(text)
    text = _drop_field_options(text)
    for source, name in PROTOS.items():
        text = text.replace(f'import "etcd/{source}";', f'import "{PACKAGE}/{name}";')
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text


def generate(out_root: Path) -> None:
    from grpc_tools import protoc  # development dependency (requirements-dev.txt)

    with tempfile.TemporaryDirectory() as tmp:
        include = Path(tmp)
        (include / PACKAGE).mkdir(parents=True)
        for source, name in PROTOS.items():
            stripped = strip((SOURCE / source).read_text())
            (include / PACKAGE / name).write_text(stripped)
        (out_root / PACKAGE).mkdir(parents=True, exist_ok=True)
        for name in PROTOS.values():
            args = [
                "protoc",
                f"-I{include}",
                f"--python_out={out_root}",
                f"--pyi_out={out_root}",
                *([f"--grpc_python_out={out_root}"] if name in SERVICES else []),
                f"{include / PACKAGE / name}",
            ]
            if protoc.main(args) != 0:
                raise SystemExit(f"protoc failed on {name}")
        (out_root / PACKAGE / "__init__.py").write_text(INIT)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="tree root to write under")
    args = parser.parse_args(argv)
    generate(args.out.resolve())


if __name__ == "__main__":
    main(sys.argv[1:])
