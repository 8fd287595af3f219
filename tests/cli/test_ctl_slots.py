"""dislockctl and N-holder leases: ls shows a key's slots together, release takes one or all."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import suppress

import pytest

import dislock
from dislock import LeaseLostError
from dislock.core.kinds import kind
from tests.cli.conftest import Ctl, env_context
from tests.support.rows import Rows


@pytest.fixture
def five_slots(cli_env: dict[str, str]) -> Iterator[list[dislock.LeaseLock]]:
    """Five holders of a 5-slot lease; the first two then release theirs."""

    def lock(n: int) -> dislock.LeaseLock:
        return dislock.LeaseLock(
            env_context(
                cli_env, f"holder-{n}", run_ttl_seconds=30, lease_interval_seconds=5, slots=5
            )
        )

    locks = [lock(n).__enter__() for n in range(1, 6)]
    for held in locks[:2]:
        held.__exit__(None, None, None)
    yield locks[2:]
    for held in locks[2:]:
        with suppress(LeaseLostError):  # the tests release some from under them
            held.__exit__(None, None, None)


def test_ls_shows_the_slots_of_a_key_together(
    ctl: Ctl, cli_env: dict[str, str], five_slots: list[dislock.LeaseLock]
) -> None:
    key = cli_env["LOCK_KEY"]
    result = ctl("ls")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    summary = [line for line in lines if line.startswith(key)]
    assert len(summary) == 1 and summary[0].split()[1:] == ["lease", "3/5", "held"]
    slots = [line.split() for line in lines if line.startswith("  slot")]
    assert [(cells[1], cells[3], cells[-1]) for cells in slots] == [
        ("1", "holder-1", "released"),  # let go by their holders
        ("2", "holder-2", "released"),
        ("3", "holder-3", "running"),
        ("4", "holder-4", "running"),
        ("5", "holder-5", "running"),
    ]
    listed = json.loads(ctl("ls", key, "--json").stdout)
    assert sorted((entry["slot"], entry["held"]) for entry in listed) == [
        (1, False),
        (2, False),
        (3, True),
        (4, True),
        (5, True),
    ]
    # A prefix selects slot rows by their lock key, not by their row key.
    assert len(json.loads(ctl("ls", key[:5], "--json").stdout)) == 5
    assert ctl("ls", "zz-no-such", "--json").stdout.strip() == "[]"


def test_release_one_slot_or_all(
    ctl: Ctl, cli_env: dict[str, str], rows: Rows, five_slots: list[dislock.LeaseLock]
) -> None:
    key = cli_env["LOCK_KEY"]
    lease = kind("lease")
    one = ctl("release", key, "--slot", "4")
    assert one.returncode == 0, one.stderr
    assert one.stdout.splitlines() == [
        line
        for line in one.stdout.splitlines()
        if line.startswith(f"released lease slot 4 {key!r}")
    ]
    assert len(one.stdout.splitlines()) == 1
    assert rows.get(lease.row_key(key, 4)).expired  # type: ignore[union-attr]
    assert not rows.get(lease.row_key(key, 3)).expired  # type: ignore[union-attr]
    assert five_slots[1].lease_lost.wait(20)  # slot 4's holder notices

    rest = ctl("release", key, "--mode", "lease")
    assert rest.returncode == 0, rest.stderr
    assert sorted(line.split()[3] for line in rest.stdout.splitlines()) == ["3", "5"]
    assert all(rows.get(lease.row_key(key, n)).expired for n in range(1, 6))  # type: ignore[union-attr]
    nothing = ctl("release", key, "--slot", "2")
    assert nothing.stdout.startswith("nothing to release: no slot 2 of the lease")
    assert ctl("release", key, "--slot", "0").returncode == 2
