"""Contract: an acquiring statement whose answer the connection lost is ridden out.

A failover that restarts the server under an acquiring statement, or a network
that drops, leaves the statement's outcome unknown: it may have committed.  The
lock reconnects within its patience, reads whether its owner's row is there,
and holds it (the statement committed) or sends the statement again (it never
ran); it neither fails nor reports a lock it took itself as another owner's.
A proxy breaks the connection at the worst moments: with the statement
committed and its answer dropped, and with the statement never forwarded.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator

import pytest

from dislock import LeaseLock, LockContext, LockNotAcquiredError, ScheduleLock
from dislock.core.context import default_owner
from dislock.core.errors import DatabaseUnreachableError
from dislock.core.rows import lease_key, schedule_key
from tests.support.drivers import CliDriver, Driver
from tests.support.proxy import AnswerCutter
from tests.support.rows import Rows, released_owner

MakeContext = Callable[..., LockContext]
ACQUIRING = b"INSERT INTO"  # every acquiring statement, and nothing else dislock sends here
YEARLY = "0 0 1 1 *"  # one slot a year: no test runs near its boundary


@pytest.fixture
def cutter(database_url: str) -> Iterator[AnswerCutter]:
    with AnswerCutter(database_url) as proxy:
        yield proxy


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "never-ran"])
@pytest.mark.parametrize("strategy", ["lease", "schedule"])
def test_a_lost_answer_still_takes_the_lock_once(
    driver: Driver,
    make_context: MakeContext,
    database_url: str,
    rows: Rows,
    cutter: AnswerCutter,
    fenced: tuple[str, str],
    committed: bool,
    strategy: str,
) -> None:
    context = make_context(
        url=cutter.url(database_url),
        owner=default_owner(),
        run_ttl_seconds=30.0,
        lease_interval_seconds=1.0,
        schedule=YEARLY,
        fencing=True,
    )
    key = lease_key(context.lock_key) if strategy == "lease" else schedule_key(context.lock_key)
    cutter.arm(ACQUIRING, committed=committed)
    held = driver.hold(context, [strategy])
    try:
        assert cutter.cuts == 1  # the connection did break under the statement
        row = rows.get(key)
        assert row is not None and not row.expired, row
        assert driver.is_owner_token(row.value, context), row
        # Taken once: a second send after a commit would have been refused.
        assert held.fencing_token() == 1
    finally:
        held.release()
    if strategy == "lease":
        after = rows.get(key)
        assert after is not None and after.expired
        assert released_owner(after.value) is not None


@pytest.mark.needs("python-api")
def test_an_owner_chosen_by_the_user_is_not_taken_for_proof(
    make_context: MakeContext, rows: Rows, cutter: AnswerCutter, database_url: str
) -> None:
    """Several machines may share an owner the user chose, so its row proves
    nothing: the lock reports itself not acquired rather than hold another's row."""
    context = make_context(
        url=cutter.url(database_url),
        owner="backup-job",
        run_ttl_seconds=30.0,
        lease_interval_seconds=1.0,
    )
    cutter.arm(ACQUIRING, committed=True)
    with pytest.raises(LockNotAcquiredError, match="held by another owner"):
        LeaseLock(context).__enter__()
    assert cutter.cuts == 1
    row = rows.get(lease_key(context.lock_key))
    assert row is not None and not row.expired and row.value == "backup-job", row


@pytest.mark.needs("python-api")
@pytest.mark.parametrize("strategy", ["lease", "schedule"])
def test_a_row_the_process_already_holds_is_not_this_acquisition(
    make_context: MakeContext, rows: Rows, cutter: AnswerCutter, strategy: str
) -> None:
    """Two locks of one LockContext write the same owner (a second run in one slot,
    a second lease at once): the second, losing its answer, must not take the
    first one's row for its own."""
    direct = make_context(
        owner=default_owner(), run_ttl_seconds=30.0, lease_interval_seconds=1.0, schedule=YEARLY
    )
    proxied = make_context(
        url=cutter.url(direct.url),
        owner=direct.owner,
        run_ttl_seconds=30.0,
        lease_interval_seconds=1.0,
        schedule=YEARLY,
    )
    lock_class = LeaseLock if strategy == "lease" else ScheduleLock
    with lock_class(direct):
        cutter.arm(ACQUIRING, committed=True)
        with pytest.raises(LockNotAcquiredError):
            lock_class(proxied).__enter__()
        assert cutter.cuts == 1
    if strategy == "schedule":
        # The slot stays the first run's, and a later run in it is still refused.
        row = rows.get(schedule_key(direct.lock_key))
        assert row is not None and not row.expired and row.value == direct.owner
        with pytest.raises(LockNotAcquiredError):
            ScheduleLock(direct).__enter__()


def test_a_lost_answer_and_no_server_after_it_is_reported_as_such(
    driver: Driver, make_context: MakeContext, database_url: str, cutter: AnswerCutter
) -> None:
    """The connection breaks under the statement and the server stays away for the
    whole patience: one line saying so, not "cannot connect" (it did connect)."""
    context = make_context(
        url=cutter.url(database_url),
        owner=default_owner(),
        run_ttl_seconds=30.0,
        lease_interval_seconds=1.0,
        connect_patience_seconds=1.5,
    )
    cutter.arm(ACQUIRING, committed=False)
    cutter.refuse_after_cut()
    if isinstance(driver, CliDriver):
        done = subprocess.run(
            [*driver.command(), driver.url_variable, "true"],
            env=driver.environment(context, ["lease"]),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1, done.stderr
        lines = [line for line in done.stderr.splitlines() if line.startswith("dislock: error:")]
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert "lost the connection to the database" in lines[0], lines
        assert "during the acquisition of lease 'cronjob-lock:lease:" in lines[0], lines
        assert "whether it was taken is unknown" in lines[0], lines
        return
    with pytest.raises(DatabaseUnreachableError) as raised:
        driver.hold(context, ["lease"])
    assert raised.value.lost_answer_of == f"lease {lease_key(context.lock_key)!r}"
    assert raised.value.unreachable_for >= 1.0
    assert "outcome is unknown" in str(raised.value)


RELEASE = b"(released)' WHERE key = $"  # a holder's release of its own row (not hand_back)


@pytest.mark.needs("python-api")
def test_a_row_left_by_a_failed_release_is_not_a_later_acquisition(
    make_context: MakeContext, rows: Rows, cutter: AnswerCutter, database_url: str
) -> None:
    """The next turn of a loop whose release failed: the row is still live, with the
    same owner, and no acquisition can have taken it (every one refuses a live
    row).  Losing its answer, the next acquisition reads that row: it must not
    take it for its own, with a clock of its own that outlives the row."""
    context = make_context(
        url=cutter.url(database_url),
        owner=default_owner(),
        run_ttl_seconds=30.0,
        lease_interval_seconds=10.0,  # no renewal while the test runs
    )
    key = lease_key(context.lock_key)
    with LeaseLock(context):
        cutter.arm(RELEASE, committed=False)  # the release never reaches the server
    assert cutter.cuts == 1
    left = rows.get(key)
    assert left is not None and not left.expired and left.value == context.owner, left
    cutter.arm(ACQUIRING, committed=True)  # refused by the live row; the answer is lost
    with pytest.raises(LockNotAcquiredError, match="held by another owner"):
        LeaseLock(context).__enter__()
    assert cutter.cuts == 2
    assert rows.get(key) == left  # untouched: still the first turn's, until its TTL
