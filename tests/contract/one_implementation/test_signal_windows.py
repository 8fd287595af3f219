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

from dislock.core.rows import lease_key
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
@pytest.mark.parametrize(
    ("window", "status"),
    [
        # ``sleep 60`` ended by the forwarded SIGTERM (128 + 15), well before its minute.
        pytest.param("starting", "143", id="before the command starts: passed on once it has"),
        # ``true`` ran; the signal is ignored while the lock is released.
        pytest.param("releasing", "0", id="as the locks are released: the release completes"),
        # The wait ends (128 + 15) and the command never runs; what was taken goes back.
        pytest.param("lease taken", "143", id="as the lease is taken: it is released"),
        pytest.param("locks held", "143", id="as the locks are held: they are released"),
    ],
)
def test_a_signal_in_a_window_of_the_run_leaves_the_lock_released(
    flavour: str,
    window: str,
    status: str,
    database_url: str,
    lock_table: tuple[str, str],
    rows: Rows,
) -> None:
    key = f"job-{uuid.uuid4().hex[:8]}"
    assert _run(flavour, window, database_url, lock_table[0], key) == status
    row = rows.get(lease_key(key))
    assert row is not None and row.expired and released_owner(row.value) is not None
