"""A refused statement (SQLSTATE 42501) in one line: which of the command's privileges
the role lacks, asked of the server (the wording and the needs are in
``dislock.cli.diagnosis``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg

from dislock.cli.diagnosis import Need, describe_denial, needs_of, privilege_probe
from dislock.core.dsn import connection_kwargs, parse_dsn, scrub

PROBE_CONNECT_TIMEOUT = 5.0
"""The command's connection is closed by the time its refusal is explained: one more,
briefly, to ask (only on this failure path); without an answer the line quotes the
server instead."""


def explain_denial(
    label: str,
    command: str,
    error: BaseException,
    *,
    tables: Mapping[str, tuple[str, ...] | None],
    url: str,
) -> str:
    """The line for ``error``, refused while ``command`` (a key of
    ``diagnosis.PRIVILEGES``) ran on ``tables``, prefixed with ``label``."""
    needs = needs_of(command, tables)
    role: str | None = None
    missing: list[Need] = []
    try:
        kwargs = connection_kwargs(url, PROBE_CONNECT_TIMEOUT)
        with psycopg.connect(url, **kwargs) as conn:
            role, missing = _probe(conn, needs)
    except psycopg.Error:
        role = parse_dsn(url).get("user")  # libpq's default otherwise: not guessed here
    detail = scrub(" ".join(str(error).split()), url)
    table = next((need.name for need in needs if need.kind == "table"), "?")
    return describe_denial(label, missing=missing, role=role, table=table, detail=detail)


def _probe(conn: Any, needs: list[Need]) -> tuple[str, list[Need]]:
    query, params = privilege_probe(needs)
    row = conn.execute(query, params).fetchone()
    role, granted = str(row[0]), list(row[1] or [])
    # NULL: a table not looked up, its schema's USAGE lacking (listed itself).
    return role, [need for need, has in zip(needs, granted, strict=True) if has is False]
