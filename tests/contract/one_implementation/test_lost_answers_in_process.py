"""Lost answers that only the sync API's lock objects can set up: what a read after a
lost answer must not take for proof that the statement committed."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from dislock import LeaseLock, LockContext, LockNotAcquiredError, ScheduleLock, keep_connected
from dislock.core.context import default_owner
from dislock.core.rows import lease_key, schedule_key
from tests.conftest import BARE_TABLES
from tests.support.proxy import AnswerCutter
from tests.support.rows import Rows

MakeContext = Callable[..., LockContext]
# Every acquiring statement (a call to the table's function, or the plain upsert on a
# table without them, where the call only finds the function missing), and nothing else
# dislock sends here.
ACQUIRING = rb"INSERT INTO" if BARE_TABLES else rb"INSERT INTO|_dislock_acquire"
YEARLY = "0 0 1 1 *"  # one slot a year: no test runs near its boundary
LEASE = {"run_ttl_seconds": 30.0, "lease_interval_seconds": 1.0}
# A holder's release of its own row (not hand_back): the table's function, or the plain
# statement on a table without it.
RELEASE = rb"_dislock_release|\(released\)' WHERE key = \$"


def warm(make_context: MakeContext, url: str) -> None:
    """Have the shared connection to ``url`` serve a lock first: on a new connection a
    lock reads its row before it sends the acquiring statement, and a live row
    refuses it there, with no acquiring statement whose answer could be lost.  On a
    warm one (a service's) the statement is sent, and these tests cut its answer."""
    with LeaseLock(make_context(url=url, lock_key=f"warm-{uuid.uuid4().hex[:8]}", **LEASE)):
        pass


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
    with lock_class(direct), keep_connected(proxied.url):
        warm(make_context, proxied.url)
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
    with keep_connected(context.url):
        warm(make_context, context.url)
        cutter.arm(ACQUIRING, committed=True)  # refused by the live row; the answer is lost
        with pytest.raises(LockNotAcquiredError, match="held by another owner"):
            LeaseLock(context).__enter__()
    assert cutter.cuts == 2
    assert rows.get(key) == left  # untouched: still the first turn's, until its TTL
