"""What every unit test starts from: a process that knows of no table without the
lock functions."""

from __future__ import annotations

import pytest

from dislock.core import protocol


@pytest.fixture(autouse=True)
def _no_table_known_bare(monkeypatch: pytest.MonkeyPatch) -> None:
    """The statements a unit test builds are the calls a process sends before it learns
    that a table has no functions (``protocol.MISSING``): a database test in the same
    worker may have learnt that of ``key_value`` (CI's PostgreSQL 15 leg makes its
    tables without them)."""
    monkeypatch.setattr(protocol, "MISSING", set())
