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
from collections.abc import Callable

import pytest

from dislock import LockContext
from dislock.core.context import default_owner
from dislock.core.errors import DatabaseUnreachableError
from dislock.core.rows import lease_key, schedule_key
from tests.support.drivers import CliDriver, Driver
from tests.support.proxy import AnswerCutter
from tests.support.rows import Rows, released_owner

MakeContext = Callable[..., LockContext]
# Every acquiring statement (a call to the table's function, or the plain upsert on a
# table without them), and nothing else dislock sends here.
ACQUIRING = rb"INSERT INTO|_dislock_acquire"
YEARLY = "0 0 1 1 *"  # one slot a year: no test runs near its boundary


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
