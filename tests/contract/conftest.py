"""The contract suite's fixtures: every test runs once per driver."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.support.drivers import AioDriver, CliDriver, Driver, SyncDriver

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


@dataclass(frozen=True)
class Row:
    value: str
    expire_at: datetime
    expired: bool


class Rows:
    """Reads and tampers with lock rows directly, as another process could."""

    def __init__(self, db: psycopg.Connection[Any], table: tuple[str, ...]) -> None:
        self.db = db
        self.table = sql.Identifier(*table)

    def get(self, key: str) -> Row | None:
        found = self.db.execute(
            sql.SQL("SELECT value, expire_at, expire_at <= NOW() FROM {} WHERE key = %s").format(
                self.table
            ),
            (key,),
        ).fetchone()
        return None if found is None else Row(*found)

    def steal(self, key: str, thief: str = "thief", seconds: float = 3600) -> None:
        """Take the row over as another owner would after it expired."""
        self.db.execute(
            sql.SQL(
                "UPDATE {} SET value = %s, expire_at = NOW() + make_interval(secs => %s)"
                " WHERE key = %s"
            ).format(self.table),
            (thief, seconds, key),
        )

    def expire(self, key: str) -> None:
        """Make the row's time run out, as the end of its slot or TTL would."""
        self.db.execute(
            sql.SQL("UPDATE {} SET expire_at = NOW() - interval '1 second' WHERE key = %s").format(
                self.table
            ),
            (key,),
        )

    def now(self) -> datetime:
        row = self.db.execute("SELECT NOW()").fetchone()
        assert row is not None
        value: datetime = row[0]
        return value


@pytest.fixture
def rows(db: psycopg.Connection[Any], lock_table: tuple[str, str]) -> Rows:
    return Rows(db, lock_table)
