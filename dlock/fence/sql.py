"""The fenced write for PostgreSQL: your table, your row, one conditional UPDATE.

    UPDATE <table> SET <fence> = :token, <your columns> = …
     WHERE <your row> AND <fence> < :token            -- a newer holder (strict)
     WHERE <your row> AND <fence> <= :token           -- the same grant again (same_grant=True)

The row count decides: one row moved means this token is the newest the row has seen and the
write is done; none means a newer token already wrote it, and `fenced_update` raises FencedOut
with the token that beat it. Table and column names are quoted identifiers, values are bound
parameters (psycopg.sql), so nothing the caller passes becomes SQL text. Works on a plain
psycopg cursor and on a Django cursor (connections[...].cursor()), inside the caller's
transaction. The fence column is a `bigint NOT NULL DEFAULT 0` on the adopter's table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import sql

from dlock.fence.refusals import fenced_out

NEWER = "<"  # a write under a newer grant: strictly greater than any token seen
SAME_GRANT = "<="  # a later step of the grant that already holds the row (claim, then post)
# `name` or `alias.name`: what fence_predicate accepts for a column inside a larger statement.
_COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?", re.ASCII)


def fence_predicate(column: str, *, same_grant: bool = False, param: str = "token") -> str:
    """`column < %(token)s` (or `<=` for the same grant): the kit's fence condition as SQL text,
    for a statement that folds the fence into a larger write (payments' claim and post)."""
    if not _COLUMN.fullmatch(column) or not param.isidentifier():
        raise ValueError(f"not a column name: {column!r}")
    return f"{column} {SAME_GRANT if same_grant else NEWER} %({param})s"


def _ident(name: str) -> sql.Composable:
    return sql.Identifier(*name.split(".")) if "." in name else sql.Identifier(name)


def _text(cursor: Any, query: sql.Composable) -> str:
    # A Django cursor wraps psycopg's: quote identifiers and literals with the real connection.
    return query.as_string(getattr(cursor, "cursor", cursor))


def fenced_update(
    cursor: Any,
    *,
    table: str,
    where: Mapping[str, Any],
    token: int,
    owner_id: str,
    resource_type: str,
    resource_id: str,
    set: Mapping[str, Any] | None = None,
    fence_column: str = "fence",
    same_grant: bool = False,
    returning: Sequence[str] = (),
) -> tuple[Any, ...]:
    """Write `set` (and the fence) on the row of `table` that `where` names (its key columns),
    only if `token` is
    newer than the row's fence (`same_grant`: or equal). Returns the `returning` columns of the
    moved row (an empty tuple without them). Raises FencedOut (409 FENCED_OUT, the event and
    lock_fenced_out_total{resource_type}) when the row's fence is newer, and LookupError when
    `where` names no row at all.

    `set` values are bound parameters; a psycopg.sql.Composable is used as an expression, e.g.
    `{"quantity": sql.SQL("quantity - {}").format(1)}`.
    """
    if not where:
        raise ValueError("where must name the row")
    if token <= 0:
        raise ValueError("fencing tokens are positive")
    params: dict[str, Any] = {"token": token}

    def bound(prefix: str, index: int, value: Any) -> sql.Composable:
        if isinstance(value, sql.Composable):
            return value
        params[f"{prefix}{index}"] = value
        return sql.Placeholder(f"{prefix}{index}")

    assignments = [sql.SQL("{} = {}").format(_ident(fence_column), sql.Placeholder("token"))]
    assignments += [
        sql.SQL("{} = {}").format(_ident(column), bound("s", i, value))
        for i, (column, value) in enumerate((set or {}).items())
    ]
    row = sql.SQL(" AND ").join(
        sql.SQL("{} = {}").format(_ident(column), bound("w", i, value))
        for i, (column, value) in enumerate(where.items())
    )
    query = sql.SQL("UPDATE {table} SET {assignments} WHERE {row} AND {fence} {op} {token}").format(
        table=_ident(table),
        assignments=sql.SQL(", ").join(assignments),
        row=row,
        fence=_ident(fence_column),
        op=sql.SQL(SAME_GRANT if same_grant else NEWER),
        token=sql.Placeholder("token"),
    )
    if returning:
        query += sql.SQL(" RETURNING {}").format(sql.SQL(", ").join(map(_ident, returning)))
    cursor.execute(_text(cursor, query), params)
    if cursor.rowcount >= 1:
        return tuple(cursor.fetchone()) if returning else ()
    # Nothing moved: either a newer token holds the row, or there is no such row.
    probe = sql.SQL("SELECT {fence} FROM {table} WHERE {row}").format(
        fence=_ident(fence_column), table=_ident(table), row=row
    )
    cursor.execute(_text(cursor, probe), params)
    found = cursor.fetchone()
    if found is None:
        raise LookupError(f"no row of {table} matches {dict(where)!r}")
    raise fenced_out(
        resource=resource_type,
        resource_id=resource_id,
        presented=token,
        highest=int(found[0]),
        owner_id=owner_id,
    )


__all__ = ["NEWER", "SAME_GRANT", "fence_predicate", "fenced_update"]
