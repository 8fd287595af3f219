"""The server processes of a test's connections, told apart by the ``application_name``
of the URL they were opened with (the contract suite's ``tagged_url``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from tests.support.eventually import eventually


def backends(db: psycopg.Connection[Any], url: str) -> list[int]:
    """The server processes of the connections opened with ``url``."""
    name = conninfo_to_dict(url)["application_name"]
    found = db.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s ORDER BY pid", (name,)
    ).fetchall()
    return [int(pid) for (pid,) in found]


def settled_backends(
    db: psycopg.Connection[Any], url: str, done: Callable[[list[int]], bool]
) -> list[int]:
    """The backends of ``url`` once ``done`` says so (a closed connection's server
    process takes a moment to go, longer on a loaded machine)."""

    def settled() -> tuple[list[int]] | None:
        found = backends(db, url)
        return (found,) if done(found) else None

    return eventually(
        settled, timeout=30.0, message=lambda: f"backends never settled: {backends(db, url)}"
    )[0]
