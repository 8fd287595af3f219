"""Contract: from taking the locks to releasing them, no instant is left in which a
forwarded signal ends the wrapper by its default action (which would leave the
lock row held until its TTL ran out, and a command that starts anyway unguarded).

Each run signals itself in a window that is microseconds wide in real life,
widened here by the script (``tests.support.signal_window``).
"""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from dislock.core.sql import lease_key
from tests.support.rows import Rows, released_owner

FLAVOURS = ["sync", "aio"]


def _run(flavour: str, window: str, url: str, schema: str, key: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "tests.support.signal_window", flavour, window, url, schema, key],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    return result.stdout.strip()


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_signal_before_the_command_starts_reaches_it_once_it_does(
    flavour: str, database_url: str, lock_table: tuple[str, str], rows: Rows
) -> None:
    key = f"job-{uuid.uuid4().hex[:8]}"
    # ``sleep 60`` ended by the forwarded SIGTERM: 128 + 15, well before its minute.
    assert _run(flavour, "starting", database_url, lock_table[0], key) == "143"
    row = rows.get(lease_key(key))
    assert row is not None and row.expired and released_owner(row.value) is not None


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_signal_as_the_locks_are_released_lets_the_release_complete(
    flavour: str, database_url: str, lock_table: tuple[str, str], rows: Rows
) -> None:
    key = f"job-{uuid.uuid4().hex[:8]}"
    assert _run(flavour, "releasing", database_url, lock_table[0], key) == "0"
    row = rows.get(lease_key(key))
    assert row is not None and row.expired and released_owner(row.value) is not None
