"""Fixtures of the trust tests: login roles of a fleet, and a lock table with grants.

The roles have fixed names (``dislock_sec_*``) so that a PgBouncer in front of the
server can list them in its ``auth_file`` (``.ci/run``); they are created once per
session and dropped after it.  Every test gets its own lock table, secured by the
real ``dislockctl grant`` as the table's owner.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.contract.conftest import driver as driver
from tests.contract.conftest import pytest_generate_tests as pytest_generate_tests

ROLES = ("dislock_sec_billing", "dislock_sec_reports", "dislock_sec_ops", "dislock_sec_reader")


@dataclass(frozen=True)
class Fleet:
    """The roles of one secured lock table and how to connect as each."""

    admin_url: str
    table: tuple[str, str]
    billing: str
    """URL of a wrapper role that may lock ``billing-*`` and ``reports-nightly``."""
    reports: str
    """URL of a wrapper role that may lock ``reports-*``."""
    ops: str
    """URL of an operator role for ``billing-*``."""
    reader: str
    """URL of a reader role."""

    def connect(self, url: str) -> psycopg.Connection[Any]:
        return psycopg.connect(url, autocommit=True, prepare_threshold=None)


def as_role(url: str, role: str) -> str:
    params = conninfo_to_dict(url)
    params["user"] = role
    return make_conninfo("", **params)


@pytest.fixture(scope="session")
def fleet_roles(database_url: str) -> Iterator[None]:
    with psycopg.connect(database_url, autocommit=True) as db:
        for role in ROLES:
            if db.execute("SELECT FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
                db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    yield
    with psycopg.connect(database_url, autocommit=True) as db:
        for role in ROLES:
            db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def ctl(url: str, *args: str, table: tuple[str, ...]) -> tuple[int, str, str]:
    """``dislockctl URL_VARIABLE ARGS…`` in this process, as the owner of ``url``."""
    import contextlib
    import io

    from dislock.cli.ctl import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(
            ["DISLOCK_ADMIN_URL", "--table", ".".join(table), *args],
            {"DISLOCK_ADMIN_URL": url, "PATH": "/usr/bin:/bin"},
        )
    return status, out.getvalue(), err.getvalue()


def with_history(
    fleet: Fleet, db: psycopg.Connection[Any], *grants: tuple[str, ...]
) -> tuple[str, ...]:
    """Create the fleet's run history table and grant ``grants`` (each a role and its
    ``grant`` options) again, as the docs say, so that they cover it too: its name."""
    from dislock.core.history import create_history, history_table

    history = history_table(fleet.table)
    for statement in create_history(history):
        db.execute(statement)
    for role, *options in grants:
        status, _, err = ctl(fleet.admin_url, "grant", role, *options, table=fleet.table)
        assert status == 0, err
    return history


BILLING = ("dislock_sec_billing", "--keys", "billing-*")
"""billing's grant, with its history (``with_history``)."""


@pytest.fixture
def fleet(
    database_url: str, lock_table: tuple[str, str], db: psycopg.Connection[Any], fleet_roles: None
) -> Iterator[Fleet]:
    schema = lock_table[0]
    for role in ROLES:  # what a DBA does once per schema; dislockctl grant does the rest
        db.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(*map(sql.Identifier, (schema, role)))
        )
    grants = [
        ("dislock_sec_billing", "--keys", "billing-*", "--keys", "reports-nightly"),
        ("dislock_sec_reports", "--keys", "reports-*"),
        ("dislock_sec_ops", "--keys", "billing-*", "--operator"),
        ("dislock_sec_reader", "--reader"),
    ]
    for arguments in grants:
        status, _, err = ctl(database_url, "grant", *arguments, table=lock_table)
        assert status == 0, err
    yield Fleet(
        admin_url=database_url,
        table=lock_table,
        billing=as_role(database_url, "dislock_sec_billing"),
        reports=as_role(database_url, "dislock_sec_reports"),
        ops=as_role(database_url, "dislock_sec_ops"),
        reader=as_role(database_url, "dislock_sec_reader"),
    )
    for role in ROLES:
        db.execute(
            sql.SQL("REVOKE ALL ON SCHEMA {} FROM {}").format(*map(sql.Identifier, (schema, role)))
        )
