"""Fixtures shared by every test: the database, an isolated lock table per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dislock import LockContext
from dislock.core.exchange import Answer, Exchange
from dislock.core.protocol import protocol_sql
from tests.support.postgres import postgres_url
from tests.support.rows import Rows

BARE_TABLES = os.environ.get("TEST_BARE_TABLES") == "1"


def as_sent(exchange: Exchange[Answer]) -> Exchange[Answer]:
    """``exchange`` as a client sends it on this suite's tables: its plain statement
    (``Exchange.fallback``) on a table without the lock functions."""
    return (exchange.fallback or exchange) if BARE_TABLES else exchange


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The Patroni tests need PostgreSQL 15 and Debian's packages, and minutes of a
    cluster of their own: they run only when ``-m`` names them (``-m patroni``), so
    a plain ``hatch test`` (and the PostgreSQL 18 leg of CI) leaves them out."""
    if "patroni" in (config.option.markexpr or ""):
        return
    chosen = [item for item in items if item.get_closest_marker("patroni") is None]
    if len(chosen) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in chosen])
        items[:] = chosen


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    with postgres_url() as url:
        yield url


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection for setting up and inspecting lock rows (never
    preparing statements, so that it works behind PgBouncer's transaction pooling)."""
    with psycopg.connect(database_url, autocommit=True, prepare_threshold=None) as conn:
        yield conn


@pytest.fixture
def lock_table(db: psycopg.Connection[Any]) -> Iterator[tuple[str, str]]:
    """A fresh ``schema.key_value`` table of the spec's shape, dropped afterwards, with
    the lock functions ``dislockctl init`` installs beside it; without them when
    ``TEST_BARE_TABLES=1`` (a table made by hand or by dislock 0.1.0: CI runs
    one leg so)."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    db.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    db.execute(
        sql.SQL(
            "CREATE TABLE {}.key_value ("
            " key text PRIMARY KEY, value text NOT NULL, expire_at timestamptz NOT NULL)"
        ).format(sql.Identifier(schema))
    )
    if not BARE_TABLES:
        db.execute(protocol_sql((schema, "key_value")))
    yield (schema, "key_value")
    db.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def make_context(database_url: str, lock_table: tuple[str, str]) -> Callable[..., LockContext]:
    """Build a LockContext on this test's table; keywords override the defaults."""
    lock_key = f"job-{uuid.uuid4().hex[:8]}"

    def make(**overrides: Any) -> LockContext:
        fields: dict[str, Any] = {
            "url": database_url,
            "table_parts": list(lock_table),
            "lock_key": lock_key,
            "owner": f"owner-{uuid.uuid4().hex[:8]}",
        }
        fields.update(overrides)
        return LockContext(**fields)

    return make


@pytest.fixture
def rows(db: psycopg.Connection[Any], lock_table: tuple[str, str]) -> Rows:
    return Rows(db, lock_table)


@pytest.fixture
def limited_url(
    request: pytest.FixtureRequest,
    db: psycopg.Connection[Any],
    database_url: str,
    lock_table: tuple[str, str],
) -> Iterator[str]:
    """The URL of a role that may hold the test module's ``LIMIT`` connections at once
    and use the test's table (``tests.support.herd.limited_role``)."""
    from tests.support.herd import limited_role

    with limited_role(db, database_url, lock_table, request.module.LIMIT) as url:
        yield url
