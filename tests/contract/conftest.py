"""The contract suite's fixtures: every test runs once per driver."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
