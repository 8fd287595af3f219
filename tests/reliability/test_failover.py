"""Failover of a primary + streaming standby pair started by the test itself (issue 13).

Each test is a row of the table in docs/guarantees.md: a holder runs a command
under a lease through the ``dislock`` wrapper, the primary crashes
(``pg_ctl -m immediate``), the standby is promoted, and a contender keeps
trying the same key.  Both commands record their own run interval (wall clock,
one machine), and the overlap of the two intervals is measured and must be none.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from dislock.core.failover import TIMELINE_KEY, TTL_KEY_PREFIX
from dislock.core.table import create_table_sql
from tests.cli.conftest import DISLOCK
from tests.support.cluster import Cluster
from tests.support.eventually import wait_for
from tests.support.replication import Pair

pytestmark = pytest.mark.slow
log = logging.getLogger(__name__)

TTL, INTERVAL = 5.0, 0.5

# The command under the lock: records when it started and when it ended (also
# when terminated), by the wall clock every process on this machine shares.
JOB = """
import signal, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
def record(what):
    with open(path, "a") as out:
        out.write(f"{what} {time.time()!r}\\n")
def stop(signum, frame):
    record("end")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
record("start")
time.sleep(seconds)
record("end")
"""


@pytest.fixture
def pair() -> Iterator[Pair]:
    servers = Pair()
    servers.sql(servers.primary, create_table_sql(("key_value",)))
    yield servers
    servers.destroy()


def dislock(
    url: str, record: Path, seconds: float, key: str = "job", *, group: str | None = None
) -> subprocess.Popen[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("LOCK_", "CRON"))},
        "DATABASE_URL": url,
        "LOCK_KEY": key,
        "LOCK_STRATEGY": "lease",
        "RUN_LOCK_TTL_SECONDS": str(TTL),
        "LOCK_LEASE_INTERVAL": str(INTERVAL),
        # (INFO: a run the group refuses says so)
        **({} if group is None else {"LOCK_GROUP": group, "CRONJOB_LOCK_LOG_LEVEL": "INFO"}),
    }
    return subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", sys.executable, "-c", JOB, str(record), str(seconds)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )


def interval(record: Path) -> tuple[float, float] | None:
    if not record.exists():
        return None
    marks = dict(line.split() for line in record.read_text().splitlines())
    return float(marks["start"]), float(marks["end"])


def overlap(a: tuple[float, float] | None, b: tuple[float, float] | None) -> float:
    if a is None or b is None:
        return 0.0
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def contend(
    url: str, record: Path, until: float, seconds: float = 0.5
) -> tuple[float | None, list[str]]:
    """Start a contender every 0.3 s until one runs its command (or ``until``
    passes); returns when the running one was started, and every attempt's stderr."""
    outputs = []
    while time.time() < until:
        started = time.time()
        attempt = dislock(url, record, seconds)
        _, stderr = attempt.communicate(timeout=60)
        outputs.append(stderr)
        if record.exists():
            assert attempt.returncode == 0, stderr
            return started, outputs
        time.sleep(0.3)
    return None, outputs


def warm_up(pair: Pair, tmp_path: Path) -> None:
    """A lock taken and released before: the table's metadata rows exist and are
    replicated, as on any server dislock has been using."""
    run = dislock(pair.url(), tmp_path / "warm-up", 0.0, key="warm-up")
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 0, stderr
    pair.wait_streaming()
    keys = {row[0] for row in pair.sql(pair.standby, "SELECT key FROM key_value")}
    assert TIMELINE_KEY in keys
    assert any(key.startswith(TTL_KEY_PREFIX) for key in keys), keys


def report(
    setup: str, holder: tuple[float, float] | None, contender: tuple[float, float] | None
) -> float:
    measured = overlap(holder, contender)
    print(f"\n[failover] {setup}: holder {holder}, contender {contender}, overlap {measured:.3f} s")
    return measured


@pytest.mark.parametrize("replication", ["async", "sync"])
def test_a_replicated_lease_survives_failover_and_nobody_else_runs(
    pair: Pair, tmp_path: Path, replication: str
) -> None:
    """The row reached the standby (asynchronously, or confirmed by synchronous
    replication): the holder renews on the promoted standby and finishes; the
    contender is skipped until then and runs afterwards."""
    if replication == "sync":
        pair.set_primary(synchronous_standby_names="standby1", synchronous_commit="on")
    warm_up(pair, tmp_path)
    holder_record, contender_record = tmp_path / "holder", tmp_path / "contender"
    holder = dislock(pair.url(), holder_record, seconds=12.0)
    wait_for(holder_record)
    pair.wait_streaming()
    pair.fail_over()
    contender_started, _ = contend(pair.url(), contender_record, until=time.time() + 40)
    _, stderr = holder.communicate(timeout=60)
    assert holder.returncode == 0, stderr  # its own status: the lease was never lost
    assert "reconnected to a server on timeline 2" in stderr
    assert contender_started is not None, "the contender never ran"
    assert (
        report(
            f"{replication}, row replicated", interval(holder_record), interval(contender_record)
        )
        == 0.0
    )


@pytest.mark.parametrize("holder_url", ["both hosts", "old primary only"])
def test_a_lost_row_is_not_taken_over_before_its_holder_stopped(
    pair: Pair, tmp_path: Path, holder_url: str
) -> None:
    """Asynchronous replication, the lease row never reached the standby: the
    promoted standby has no row, and the lock delay keeps the contender out
    until the holder has stopped (its renewal finds the row gone, or its
    deadline passes)."""
    warm_up(pair, tmp_path)
    old_primary = pair.primary
    pair.standby.stop()  # whatever the primary writes now never reaches it
    holder_record, contender_record = tmp_path / "holder", tmp_path / "contender"
    holder = dislock(pair.url(both=holder_url == "both hosts"), holder_record, seconds=30.0)
    wait_for(holder_record)
    time.sleep(1.0)  # a few renewals, on the primary only
    old_primary.stop("immediate")
    pair.standby.start()
    pair.standby._run("pg_ctl", "-D", str(pair.standby.data), "-w", "promote")
    pair.primary, pair.standby = pair.standby, pair.primary
    promoted_at = time.time()
    contender_started, _ = contend(pair.url(), contender_record, until=time.time() + 40)
    _, stderr = holder.communicate(timeout=60)
    setup = f"async, row not replicated, holder URL: {holder_url}"
    assert report(setup, interval(holder_record), interval(contender_record)) == 0.0
    assert holder.returncode == 75, stderr  # terminated: the lease was lost
    assert contender_started is not None, "the contender never ran"
    # The lock delay: nobody took the missing row for one TTL after promotion.  The
    # contender's command start is measured (not when its attempt was started: a
    # wrapper start-up on a loaded machine can take longer than the slack), with
    # 0.5 s for pg_ctl to notice the promotion after the server made it.
    contender = interval(contender_record)
    assert contender is not None and contender[0] >= promoted_at + TTL - 0.5


GROUP = "heavy:2"


@dataclasses.dataclass
class Run:
    """A wrapper started in the group, and what became of it."""

    name: str
    process: subprocess.Popen[str]
    record: Path
    exited: float | None = None
    """When this test saw the wrapper gone (wall clock): the latest its command ran."""
    stderr: str = ""

    def reap(self) -> bool:
        """Whether the wrapper has exited (its stderr read then)."""
        if self.exited is None and self.process.poll() is not None:
            self.exited = time.time()
            _, self.stderr = self.process.communicate()
        return self.exited is not None

    def interval(self) -> tuple[float, float] | None:
        """The command's run, from its record; a command killed before it could
        record its end (SIGKILL at its lease deadline) ran until its wrapper exited,
        at the latest."""
        if not self.record.exists():
            return None
        marks = dict(line.split() for line in self.record.read_text().splitlines())
        end = marks.get("end")
        if end is None:
            assert self.exited is not None, f"{self.name} still runs"
            return float(marks["start"]), self.exited
        return float(marks["start"]), float(end)


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of runs whose intervals overlap at one instant."""
    return max((sum(1 for s, e in spans if s <= at < e) for at, _ in spans), default=0)


def promote_stopped_standby(pair: Pair) -> float:
    """Fail over to a standby that was stopped (what the primary wrote since never
    reached it): the primary crashes, the standby starts and is promoted, the roles
    swap.  Returns when the promotion was done."""
    pair.primary.stop("immediate")
    pair.standby.start()
    pair.standby._run("pg_ctl", "-D", str(pair.standby.data), "-w", "promote")
    pair.primary, pair.standby = pair.standby, pair.primary
    return time.time()


@pytest.mark.parametrize("replicated", ["both rows", "one row", "no row"])
def test_a_group_across_a_database_failover_never_runs_more_than_its_slots(
    pair: Pair, tmp_path: Path, replicated: str
) -> None:
    """A group of two, its two slots held by two wrappers of two keys (asynchronous
    replication); the primary crashes, the standby is promoted with both holders'
    rows (lease and group slot), one holder's, or neither's; contenders of a third
    key of the group start every 0.5 s.  An old holder either renews on the
    promoted standby (its rows are there) or stops by its lease deadline (its
    renewal finds them gone, or fails until then), and the lock delay keeps every
    missing row, the group's slots included, from being taken until then: at no
    instant do more than two of the group's commands run."""
    warm_up(pair, tmp_path)
    holders: list[Run] = []

    def hold(name: str) -> None:
        record = tmp_path / name
        process = dislock(pair.url(), record, 15.0, key=name, group=GROUP)
        holders.append(Run(name, process, record))
        wait_for(record)

    if replicated == "no row":
        pair.standby.stop()  # whatever the primary writes now never reaches it
    hold("holder-a")
    if replicated == "one row":
        pair.wait_streaming()  # holder-a's lease and group slot are on the standby ...
        pair.standby.stop()  # ... holder-b's never will be
    hold("holder-b")
    if replicated == "both rows":
        pair.wait_streaming()
        pair.fail_over()
        promoted_at = time.time()
    else:
        time.sleep(1.0)  # a few renewals, on the primary only
        promoted_at = promote_stopped_standby(pair)

    contenders: list[Run] = []
    deadline = promoted_at + 60
    while time.time() < deadline:
        for run in holders + contenders:
            run.reap()
        if all(h.exited for h in holders) and any(c.record.exists() for c in contenders):
            break
        if sum(1 for c in contenders if c.exited is None) < 4:  # a loaded machine
            name = f"contender-{len(contenders)}"
            record = tmp_path / name
            process = dislock(pair.url(), record, 1.0, key="contender", group=GROUP)
            contenders.append(Run(name, process, record))
        time.sleep(INTERVAL)
    for run in holders + contenders:
        run.process.wait(timeout=60)
        run.reap()

    spans = {run.name: run.interval() for run in holders + contenders}
    ran = {name: span for name, span in spans.items() if span is not None}
    most = most_at_once(list(ran.values()))
    delayed = sum("lock delay after a database failover" in c.stderr for c in contenders)
    full = sum("is full" in c.stderr for c in contenders)
    started = [span[0] - promoted_at for name, span in ran.items() if name.startswith("cont")]
    print(
        f"\n[failover] group of 2, async, {replicated} replicated:"
        f" holders' exits {[h.process.returncode for h in holders]},"
        f" {len(contenders)} contender attempts, {len(started)} ran"
        f" (first at {min(started, default=float('nan')):+.1f} s from the promotion),"
        f" {delayed} refused by the lock delay, {full} by the full group;"
        f" at most {most} at once"
    )
    relative = {name: (a - promoted_at, b - promoted_at) for name, (a, b) in ran.items()}
    assert most <= 2, relative  # the runs' intervals, from the promotion
    for holder in holders:
        # 0: renewed on the promoted standby throughout; 75: its lease was lost
        expected = {"both rows": {0}, "one row": {0, 75}, "no row": {75}}[replicated]
        if replicated == "one row" and holder.name == "holder-b":
            expected = {75}
        assert holder.process.returncode in expected, (holder.name, holder.stderr)
    assert started, "no contender ever ran"


@pytest.mark.parametrize("mode", ["on", "remote_apply"])
def test_an_acquisition_synchronous_replication_did_not_confirm_is_handed_back(
    pair: Pair, tmp_path: Path, mode: str
) -> None:
    """``synchronous_commit = on`` with the standby gone, or ``remote_apply`` with
    its replay paused: the acquisition's wait for the standby is cancelled, the
    server commits locally and warns; dislock hands the row back and fails."""
    warm_up(pair, tmp_path)
    pair.set_primary(synchronous_standby_names="standby1", synchronous_commit=mode)
    if mode == "on":
        pair.standby.stop()
    else:
        pair.pause_replay()
    holder_record, contender_record = tmp_path / "holder", tmp_path / "contender"
    holder = dislock(pair.url(), holder_record, seconds=30.0)
    _, stderr = holder.communicate(timeout=60)
    assert holder.returncode == 1, stderr
    assert "was not acquired (handed back)" in stderr
    assert "no synchronous standby confirmed it" in stderr
    assert not holder_record.exists()  # the command never ran
    rows = pair.sql(
        pair.primary, "SELECT expire_at <= NOW() FROM key_value WHERE key LIKE '%lease:job'"
    )
    assert rows == [(True,)]  # handed back on the primary
    if mode == "on":
        pair.standby.start()
    pair.fail_over()
    contender_started, _ = contend(pair.url(), contender_record, until=time.time() + 40)
    assert contender_started is not None
    assert (
        report(
            f"sync {mode}, standby not confirming",
            interval(holder_record),
            interval(contender_record),
        )
        == 0.0
    )


def test_renewals_synchronous_replication_did_not_confirm_count_as_failures(
    pair: Pair, tmp_path: Path
) -> None:
    """The standby goes away while the command runs under ``synchronous_commit =
    on``: every renewal commits only locally, so none counts; the lease is lost
    at its deadline and the command stopped before a failover can hand the row on."""
    pair.set_primary(synchronous_standby_names="standby1", synchronous_commit="on")
    warm_up(pair, tmp_path)
    holder_record, contender_record = tmp_path / "holder", tmp_path / "contender"
    holder = dislock(pair.url(), holder_record, seconds=30.0)
    wait_for(holder_record)
    pair.wait_streaming()
    pair.standby.stop()
    _, stderr = holder.communicate(timeout=60)
    assert holder.returncode == 75, stderr
    assert "NotReplicatedError" in stderr  # the failed attempts said why
    pair.standby.start()
    pair.fail_over()
    contender_started, _ = contend(pair.url(), contender_record, until=time.time() + 40)
    assert contender_started is not None
    assert (
        report(
            "sync on, standby lost while held", interval(holder_record), interval(contender_record)
        )
        == 0.0
    )


def test_a_restart_of_a_single_server_starts_no_lock_delay(tmp_path: Path) -> None:
    server = Cluster()
    server.start()
    try:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(create_table_sql(("key_value",)))
        first = dislock(server.url, tmp_path / "first", 0.0, key="first")
        assert first.communicate(timeout=60) and first.returncode == 0
        server.restart_after(0.5)
        second = dislock(server.url, tmp_path / "second", 0.0, key="second")
        _, stderr = second.communicate(timeout=60)
        assert second.returncode == 0, stderr
        assert (tmp_path / "second").exists(), stderr  # taken at once, no delay
    finally:
        server.destroy()


def test_dislockctl_check_refuses_a_standby(pair: Pair) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("LOCK_", "CRON"))},
        "DATABASE_URL": pair.standby.url,
        "LOCK_KEY": "job",
        "LOCK_STRATEGY": "lease",
        "RUN_LOCK_TTL_SECONDS": "5",
        "LOCK_LEASE_INTERVAL": "1",
    }
    standby = subprocess.run(
        [sys.executable, "-m", "dislock.cli.ctl", "DATABASE_URL", "check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert standby.returncode == 1
    assert standby.stdout == ""
    assert standby.stderr.count("\n") == 1
    assert "standby" in standby.stderr and "target_session_attrs=read-write" in standby.stderr
    env["DATABASE_URL"] = pair.url()
    both = subprocess.run(
        [sys.executable, "-m", "dislock.cli.ctl", "DATABASE_URL", "check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert both.returncode == 0, both.stderr
    assert "\n  standbys        1: standby1 (async)\n" in both.stdout, both.stdout


def test_the_wrapper_on_a_standby_fails_with_one_line(pair: Pair, tmp_path: Path) -> None:
    run = dislock(pair.standby.url, tmp_path / "never", 1.0)
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 1
    assert stderr.count("\n") == 1, stderr
    assert "read-only" in stderr and "point the URL at the primary" in stderr
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("flavour", ["sync", "aio", "slots"])
def test_both_flavours_hand_back_an_unconfirmed_acquisition(pair: Pair, flavour: str) -> None:
    """The asyncio flavour cancels its statement differently (the task, not a
    cancel thread): the server's warning arrives all the same."""
    import asyncio

    from dislock import LeaseLock as SyncLeaseLock
    from dislock import LockContext, NotReplicatedError
    from dislock.aio import LeaseLock as AioLeaseLock

    pair.set_primary(synchronous_standby_names="standby1", synchronous_commit="on")
    pair.standby.stop()
    context = LockContext(
        url=pair.url(),
        table_parts=["key_value"],
        lock_key=f"api-{flavour}",
        owner="unconfirmed",
        run_ttl_seconds=TTL,
        lease_interval_seconds=INTERVAL,
        slots=2 if flavour == "slots" else 1,
    )
    if flavour != "aio":
        with pytest.raises(NotReplicatedError, match="handed back"), SyncLeaseLock(context):
            pytest.fail("the block ran")
    else:

        async def take() -> None:
            async with AioLeaseLock(context):
                pytest.fail("the block ran")

        with pytest.raises(NotReplicatedError, match="handed back"):
            asyncio.run(take())
    rows = pair.sql(
        pair.primary,
        "SELECT value, expire_at <= NOW() FROM key_value WHERE key LIKE %s",
        (f"cronjob-lock:lease:api-{flavour}%",),
    )
    # the one row taken (slot 1 for slots), handed back (a release marks the owner)
    assert len(rows) == 1 and rows[0][0].startswith("unconfirmed") and rows[0][1] is True


def test_split_brain_without_fencing_lets_both_sides_grant_the_lease(
    pair: Pair, tmp_path: Path
) -> None:
    """What fencing the old primary prevents, measured: it restarts unfenced on
    its old timeline, its holder renews there, and the promoted standby grants
    the same lease once the lock delay is over.  dislock cannot see this (two
    servers, each consistent); docs/guarantees.md says to fence."""
    warm_up(pair, tmp_path)
    old_primary = pair.primary
    holder_record, contender_record = tmp_path / "holder", tmp_path / "contender"
    holder = dislock(pair.url(both=False), holder_record, seconds=20.0)
    wait_for(holder_record)
    pair.wait_streaming()
    pair.fail_over()
    old_primary.start()  # back as a primary on timeline 1, nobody fenced it
    contender_started, _ = contend(pair.primary.url, contender_record, time.time() + 30, 3.0)
    _, stderr = holder.communicate(timeout=60)
    assert holder.returncode == 0, stderr  # renewed on the old primary throughout
    assert contender_started is not None
    measured = report(
        "split brain, old primary unfenced", interval(holder_record), interval(contender_record)
    )
    assert measured > 2.0  # the contender's whole run overlapped the holder's
