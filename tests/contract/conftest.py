"""The contract suite's fixtures: every test runs once per driver."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from dislock.cli.admin import init_statements
from dislock.core.history import create_history, history_table
from dislock.core.history_functions import history_functions_sql
from tests.support.drivers import AioDriver, CliDriver, Driver, SyncDriver
from tests.support.proxy import AnswerCutter

_DRIVERS: dict[str, type[Driver]] = {"sync": SyncDriver, "aio": AioDriver, "cli": CliDriver}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each contract test on every driver that has the features it is marked with
    (``@pytest.mark.needs("python-api")``); a test is never generated for a driver
    that cannot express it, rather than skipped there."""
    if "driver" not in metafunc.fixturenames:
        return
    needed: set[str] = set()
    for marker in metafunc.definition.iter_markers("needs"):
        needed.update(marker.args)
    names = [name for name, cls in _DRIVERS.items() if needed <= cls.features]
    metafunc.parametrize("driver", names, indirect=True, scope="session")


@pytest.fixture(scope="session")
def driver(request: pytest.FixtureRequest) -> Iterator[Driver]:
    instance = _DRIVERS[request.param]()
    yield instance
    instance.close()


@pytest.fixture
def tagged_url(database_url: str) -> str:
    """A URL of its own (its own ``application_name``), so that the connection the
    locks share is this test's alone and its server processes can be told apart."""
    return make_conninfo(database_url, application_name=f"dislock-test-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def cutter(database_url: str) -> Iterator[AnswerCutter]:
    """A proxy to the test server that breaks the connection under a chosen statement."""
    with AnswerCutter(database_url) as proxy:
        yield proxy


@pytest.fixture
def history(db: psycopg.Connection[Any], lock_table: tuple[str, str]) -> tuple[str, ...]:
    """The test's history table, created as `dislockctl init --history` does."""
    from tests.conftest import BARE_TABLES

    table = history_table(lock_table)
    for statement in create_history(table):
        db.execute(statement)
    if not BARE_TABLES:
        db.execute(history_functions_sql((table[0], table[1]), lock_table))
    return table


@pytest.fixture
def fenced(db: psycopg.Connection[Any], lock_table: tuple[str, str]) -> tuple[str, str]:
    """The test's table, given its fence column the way `dislockctl init --fencing` does."""
    for statement in init_statements(lock_table, fencing=True):
        db.execute(statement)
    return lock_table
