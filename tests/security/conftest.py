"""Fixtures of the trust tests: login roles of a fleet, and a lock table with grants.

The roles are cluster-wide, unlike the lock tables: each pytest-xdist worker has
roles of its own (``dislock_sec_billing_gw0``; without xdist ``dislock_sec_billing``),
so that two workers on one server neither race to create them nor drop the other's.
They are created once per session and dropped after it (a PgBouncer in front of the
server looks each one up as its ``auth_user``, ``.ci/run``).  Every test gets its own
lock table, secured by the real ``dislockctl grant`` as the table's owner.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.contract.conftest import driver as driver
from tests.contract.conftest import pytest_generate_tests as pytest_generate_tests


def role_name(team: str) -> str:
    """The role of ``team`` (billing, reports, ops, reader) in this worker's fleet."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return f"dislock_sec_{team}" + (f"_{worker}" if worker else "")


BILLING_ROLE = role_name("billing")
REPORTS_ROLE = role_name("reports")
OPS_ROLE = role_name("ops")
READER_ROLE = role_name("reader")
ROLES = (BILLING_ROLE, REPORTS_ROLE, OPS_ROLE, READER_ROLE)


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


GRANTS = {
    BILLING_ROLE: ("--keys", "billing-*", "--keys", "reports-nightly"),
    REPORTS_ROLE: ("--keys", "reports-*"),
    OPS_ROLE: ("--keys", "billing-*", "--operator"),
    READER_ROLE: ("--reader",),
}
"""Each role's grant in the fleet."""


def plain_writes(fleet: Fleet, role: str) -> None:
    """Grant ``role`` again with ``--plain-writes``: it may then write the lock table by
    hand, held by its row-level security policies (as a role shared with dislock 0.1.0
    machines is), which the test puts to the proof."""
    status, _, err = ctl(
        fleet.admin_url, "grant", role, *GRANTS[role], "--plain-writes", table=fleet.table
    )
    assert status == 0, err


BILLING = (BILLING_ROLE, "--keys", "billing-*")
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
    for role, arguments in GRANTS.items():
        status, _, err = ctl(database_url, "grant", role, *arguments, table=lock_table)
        assert status == 0, err
    yield Fleet(
        admin_url=database_url,
        table=lock_table,
        billing=as_role(database_url, BILLING_ROLE),
        reports=as_role(database_url, REPORTS_ROLE),
        ops=as_role(database_url, OPS_ROLE),
        reader=as_role(database_url, READER_ROLE),
    )
    for role in ROLES:
        db.execute(
            sql.SQL("REVOKE ALL ON SCHEMA {} FROM {}").format(*map(sql.Identifier, (schema, role)))
        )
