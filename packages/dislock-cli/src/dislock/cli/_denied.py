"""A refused statement (SQLSTATE 42501) in one line: which of the command's privileges
the role lacks, and, where row-level security limits it, the ``dislockctl grant`` that
gives them, or whose the key is when another role's grant covers it, asked of the server
(the wording is ``dislock.cli.diagnosis``'s)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import psycopg

from dislock.cli.diagnosis import (
    LOCK_TABLE,
    Need,
    RowSecurity,
    denial_hint,
    describe_denial,
    needs_of,
    privilege_probe,
    row_security,
)
from dislock.cli.sending import send
from dislock.core.dsn import connection_kwargs, one_line, parse_dsn, scrub
from dislock.core.grant_catalog import grants_on

if TYPE_CHECKING:
    from dislock.cli.sending import Connection
    from dislock.core.grants import Grant

PROBE_CONNECT_TIMEOUT = 5.0
"""The command's connection is closed by now: one more, briefly, to ask."""


def explain_denial(
    label: str,
    command: str,
    error: BaseException,
    *,
    tables: Mapping[str, tuple[str, ...] | None],
    url: str,
    key: str | None = None,
) -> str:
    """The line for ``error``, refused while ``command`` ran on ``tables`` for ``key``."""
    needs = needs_of(command, tables)
    role: str | None = None
    missing: list[Need] = []
    security: RowSecurity | None = None
    grants: list[Grant] = []
    try:
        with psycopg.connect(url, **connection_kwargs(url, PROBE_CONNECT_TIMEOUT)) as conn:
            role, missing = _probe(conn, needs)
            if (lock_table := tables.get(LOCK_TABLE)) is not None:
                security = send(conn, row_security(lock_table))
                if security is not None and security.limited and key is not None:
                    grants = send(conn, grants_on(lock_table))  # whose the key is
    except psycopg.Error:
        if role is None:
            role = parse_dsn(url).get("user")  # libpq's default otherwise: not guessed here
    detail = scrub(one_line(str(error)), url)
    table = next((need.name for need in needs if need.kind == "table"), "?")
    fix = None if security is None else denial_hint(command, security, key, grants)
    return describe_denial(label, missing=missing, role=role, table=table, detail=detail, fix=fix)


def _probe(conn: Connection, needs: list[Need]) -> tuple[str, list[Need]]:
    query, params = privilege_probe(needs)
    row = conn.execute(query, params).fetchone()
    if row is None:
        raise RuntimeError("the privilege probe answered no row")
    role, granted = str(row[0]), list(row[1] or [])
    # NULL: a table not looked up, its schema's USAGE lacking (listed itself).
    return role, [need for need, has in zip(needs, granted, strict=True) if has is False]
