"""Failovers of a real Patroni cluster (issue 24): three PostgreSQL 15 nodes, etcd, HAProxy.

The cluster (``tests.support.patroni``) is started once for the module.  In each
test a holder runs a command under a lease through the ``dislock`` wrapper while a
contender is started every 0.5 s (at most four at once) on the same key, all on a
multi-host URL with ``target_session_attrs=read-write`` (or through HAProxy, or
choosing a host at random); then Patroni switches over, the leader crashes, the leader
freezes, the leader's Patroni loses etcd, or it alone freezes (with strict synchronous
mode, and without: the lock splits, measured).  Every command records its own
start and end (``JOB``, the wall clock this machine's processes share), and the
overlap of every pair of runs is asserted to be none.

Each test prints one ``[patroni]`` line: the overlaps, the holder's exit, how many
contenders ran and how many exited non-zero (the numbers issue 24 asks for), and in the
partition and frozen-agent tests how many rode out a read-only or unconfirmed answer
(issue 55); docs/guarantees.md's table of them is these lines.

Marked ``patroni``: they need Debian's packages and PostgreSQL 15, and run only when
``-m`` selects them (``tests/conftest.py``); .ci/run runs them on its Debian leg.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dislock.core.failover import TIMELINE_KEY, TTL_KEY_PREFIX
from dislock.core.table import create_table_sql
from tests.cli.conftest import DISLOCK
from tests.reliability.test_failover import JOB, overlap
from tests.support.eventually import wait_for
from tests.support.patroni import PATRONI_TTL, Node, PatroniCluster, PrimaryWatch, missing

pytestmark = [pytest.mark.patroni, pytest.mark.slow]

TTL, INTERVAL = 5.0, 0.5  # the lease of holders and contenders
EVERY = 0.5  # a contender this often
# The longest TTL the table has seen, hence the lock delay after a failover: long
# enough for a poll of ``dislockctl check`` to see the delay on a loaded machine.
DELAY_TTL = 15.0

# JOB's records, for a command that runs until the test creates a file (argv[3]):
# the switchover test ends its holder once the holder has renewed on the new primary.
UNTIL_JOB = JOB.replace(
    "time.sleep(seconds)",
    "import os\nstop = time.time() + seconds\n"
    "while time.time() < stop and not os.path.exists(sys.argv[3]):\n    time.sleep(0.05)",
)
assert UNTIL_JOB != JOB


Overlap = tuple[str, str, float]
"""Two runs' names and how long their commands overlapped, in seconds."""


@pytest.fixture(scope="module")
def patroni() -> Iterator[PatroniCluster]:
    reason = missing()
    if reason:
        pytest.skip(f"no Patroni cluster: {reason}")
    cluster = PatroniCluster()
    yield cluster
    cluster.destroy()


@pytest.fixture
def cluster(patroni: PatroniCluster) -> PatroniCluster:
    """The module's cluster, healthy again: a node a previous test crashed is
    restarted (Patroni rewinds it and it rejoins as a replica)."""
    for node in patroni.nodes:
        if node.process is None or node.process.poll() is not None:
            patroni.start(node)
    patroni.wait_healthy()
    return patroni


@pytest.fixture
def table(cluster: PatroniCluster) -> str:
    """A lock table of this test's own (the lock delay's metadata rows are per table)."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    cluster.on_leader(f"CREATE SCHEMA {schema}")
    cluster.on_leader(create_table_sql((schema, "key_value")))
    return f"{schema}.key_value"


@dataclass
class Run:
    """One wrapper started by the test: its process, its command's record, its stderr."""

    process: subprocess.Popen[bytes]
    record: Path
    log: Path
    started: float

    def wait(self, timeout: float = 120.0) -> int:
        return self.process.wait(timeout=timeout)

    @property
    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def interval(self) -> tuple[float, float] | None:
        """When the command ran; a command that never recorded its end (killed) counts
        as running until now, which can only make an overlap bigger."""
        if not self.record.exists():
            return None
        marks = dict(line.split() for line in self.record.read_text().splitlines())
        if "start" not in marks:
            return None
        return float(marks["start"]), float(marks.get("end", time.time()))


def wrapper(
    url: str,
    table: str,
    directory: Path,
    name: str,
    *,
    seconds: float,
    key: str = "job",
    ttl: float = TTL,
    until: Path | None = None,
    **env: str,
) -> Run:
    record, log = directory / f"{name}.record", directory / f"{name}.log"
    variables = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("LOCK_", "CRON", "DISLOCK_"))},
        "DATABASE_URL": url,
        "LOCK_TABLE": table,
        "LOCK_KEY": key,
        "LOCK_STRATEGY": "lease",
        "RUN_LOCK_TTL_SECONDS": str(ttl),
        "LOCK_LEASE_INTERVAL": str(INTERVAL),
        **env,
    }
    command = [sys.executable, "-c", JOB, str(record), str(seconds)]
    if until is not None:
        command = [sys.executable, "-c", UNTIL_JOB, str(record), str(seconds), str(until)]
    with log.open("wb") as stderr:  # a file: a full pipe would stall the wrapper
        process = subprocess.Popen(
            [*DISLOCK, "DATABASE_URL", *command],
            env=variables,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    return Run(process, record, log, time.time())


class Contenders:
    """A contender started every ``EVERY`` seconds in a thread, until stopped (at most
    ``limit`` at once: a start-up slowed by the load must not snowball)."""

    def __init__(self, start: Callable[[str], Run], limit: int = 4) -> None:
        self.runs: list[Run] = []
        self._start = start
        self._limit = limit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        n = 0
        while not self._stop.is_set():
            if sum(run.process.poll() is None for run in self.runs) < self._limit:
                n += 1
                self.runs.append(self._start(f"contender-{n}"))
            self._stop.wait(EVERY)

    def ran_after(self, instant: float) -> bool:
        """Whether a contender's command has started after ``instant`` (and ended)."""
        return any(
            run.process.poll() is not None and (i := run.interval) is not None and i[0] > instant
            for run in list(self.runs)
        )

    def stop(self) -> list[Run]:
        """No more contenders; waits for the running ones (they end on their own)."""
        self._stop.set()
        self._thread.join(timeout=60)
        for run in self.runs:
            run.wait()
        return self.runs


class Scenario:
    """A holder and its contenders; ``finish`` stops them and prints the test's
    ``[patroni]`` line, also when the test failed half-way (``scenario`` fixture)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.holder: Run | None = None
        self.contenders: Contenders | None = None
        self.notes: list[str] = []
        self.finished = False

    def finish(self) -> tuple[list[Run], list[Overlap]]:
        runs = self.contenders.stop() if self.contenders else []
        if self.holder is not None and self.holder.process.poll() is None:
            self.holder.process.kill()  # the test failed before the holder ended
            self.holder.wait()
        every = [self.holder, *runs] if self.holder else runs
        found = overlaps(every)
        if not self.finished:
            self.finished = True
            report(f"{self.name} ({', '.join(self.notes)})", self.holder, runs, found)
        return runs, found


@pytest.fixture
def scenario(request: pytest.FixtureRequest) -> Iterator[Scenario]:
    current = Scenario(request.node.name)
    yield current
    current.finish()


def poll(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.2)


def overlaps(runs: list[Run]) -> list[Overlap]:
    """Every pair of runs whose commands overlapped, and by how long."""
    found = []
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            measured = overlap(a.interval, b.interval)
            if measured > 0:
                found.append((a.record.stem, b.record.stem, round(measured, 3)))
    return found


def report(scenario: str, holder: Run | None, contenders: list[Run], found: object) -> None:
    failed = [run for run in contenders if run.process.returncode != 0]
    ran = sum(run.interval is not None for run in contenders)
    holder_exit = holder.process.returncode if holder else "-"
    print(
        f"\n[patroni] {scenario}: overlaps {found}, holder exit {holder_exit},"
        f" contenders {len(contenders)} ({ran} ran their command), {len(failed)} exited non-zero"
        f"{rode_out(contenders)}"
    )
    if holder is not None and holder.process.returncode:
        print(f"  holder: {holder.stderr.strip()[-400:]}")
    for run in failed[:3]:
        print(f"  {run.record.stem} exit {run.process.returncode}: {run.stderr.strip()[-300:]}")


def rode_out(runs: list[Run]) -> str:
    """How many wrappers logged (at INFO) that they tried again after a read-only or an
    unconfirmed answer (``dislock.core.acquisition.riding_out``); empty if none did."""
    read_only = unconfirmed = 0
    for run in runs:
        tried = [line for line in run.stderr.splitlines() if "; trying again in " in line]
        read_only += any("read-only" in line for line in tried)
        unconfirmed += any("synchronous standby" in line for line in tried)
    if not read_only + unconfirmed:
        return ""
    return f"; rode out read-only answers: {read_only}, unconfirmed commits: {unconfirmed}"


def warm_up(cluster: PatroniCluster, url: str, table: str, directory: Path) -> None:
    """A lease with ``DELAY_TTL`` taken and released: the table's timeline and longest
    TTL are recorded and replicated, as on any table dislock has been using."""
    run = wrapper(url, table, directory, "warm-up", seconds=0.0, key="warm-up", ttl=DELAY_TTL)
    assert run.wait() == 0, run.stderr
    cluster.wait_replicated(
        f"SELECT count(*) = 2 FROM {table}"
        f" WHERE key = '{TIMELINE_KEY}' OR starts_with(key, '{TTL_KEY_PREFIX}')"
    )


def check(url: str, table: str) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("LOCK_", "CRON", "DISLOCK_"))},
        "DATABASE_URL": url,
        "LOCK_TABLE": table,
        "LOCK_KEY": "job",
        "LOCK_STRATEGY": "lease",
        "RUN_LOCK_TTL_SECONDS": str(TTL),
        "LOCK_LEASE_INTERVAL": str(INTERVAL),
    }
    return subprocess.run(
        [sys.executable, "-m", "dislock.cli.ctl", "DATABASE_URL", "check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def wait_new_leader(cluster: PatroniCluster, old: Node, timeout: float = 90.0) -> Node:
    poll(lambda: cluster.leader(besides=old), timeout, f"a leader other than {old.name}")
    leader = cluster.leader(besides=old)
    assert leader is not None
    return leader


def test_a_lease_longer_than_a_switchover_is_kept(
    cluster: PatroniCluster, table: str, tmp_path: Path, scenario: Scenario
) -> None:
    """``patronictl switchover``: the old leader shuts down cleanly (every row reached
    the candidate), the candidate is promoted; the holder, whose TTL exceeds the time
    with no primary, renews on it and finishes; contenders skip until then."""
    ttl = 15.0
    warm_up(cluster, cluster.url, table, tmp_path)
    old = cluster.leader()
    assert old is not None
    candidate = next(node for node in cluster.nodes if node is not old)
    enough = tmp_path / "enough"
    holder = wrapper(cluster.url, table, tmp_path, "holder", seconds=120, ttl=ttl, until=enough)
    scenario.holder = holder
    wait_for(holder.record, timeout=60)
    scenario.contenders = Contenders(
        lambda name: wrapper(cluster.url, table, tmp_path, name, seconds=0.5)
    )
    watch = PrimaryWatch(cluster.url)
    switched = cluster.patronictl(
        "switchover", "--leader", old.name, "--candidate", candidate.name, "--force"
    )
    assert switched.returncode == 0, switched.stdout + switched.stderr
    poll(lambda: cluster.leader() is candidate, 60, f"{candidate.name} to accept writes")
    without_primary = watch.stop()
    scenario.notes.append(f"{without_primary:.1f} s with no primary")
    renewed = "reconnected to a server on timeline"
    poll(lambda: renewed in holder.stderr, 60, "the holder to renew on the new primary")
    enough.touch()
    holder.wait()
    holder_end = time.time()
    poll(
        lambda: scenario.contenders and scenario.contenders.ran_after(holder_end),
        90,
        "a contender to run after the holder",
    )
    runs, found = scenario.finish()
    assert without_primary < ttl, "the switchover took longer than the lease: no test"
    assert found == []
    assert holder.process.returncode == 0, holder.stderr  # the lease was kept
    assert [run.process.returncode for run in runs if run.process.returncode] == []


def crash_leader_and_wait(
    cluster: PatroniCluster, scenario: Scenario, then: Callable[[], None] = lambda: None
) -> Node:
    """Crash the leader, call ``then``; the new leader, once it accepts writes."""
    old = cluster.leader()
    assert old is not None
    cluster.crash(old)
    then()
    crashed = time.monotonic()
    new = wait_new_leader(cluster, old)
    scenario.notes.append(f"{time.monotonic() - crashed:.1f} s with no primary")
    return new


@pytest.mark.parametrize("through", ["multi-host URL", "HAProxy"])
def test_a_crashed_leader_hands_the_lease_on_only_after_its_holder_stopped(
    cluster: PatroniCluster, table: str, tmp_path: Path, scenario: Scenario, through: str
) -> None:
    """Patroni and the postmaster of the leader are killed: a replica takes over
    once the leader key expires (Patroni's ttl, longer than the lease).  The holder
    stops at its deadline (or keeps its lease, if it renewed on the promoted
    replica in time); the lock delay shows in ``dislockctl check``; contenders skip
    or run, one at a time, and exit 0.  Through HAProxy, whose check is Patroni's
    ``/primary``, the same."""
    url = cluster.url
    if through == "HAProxy":
        cluster.start_haproxy()
        url = cluster.haproxy_url
    warm_up(cluster, url, table, tmp_path)
    holder = wrapper(url, table, tmp_path, "holder", seconds=60.0)
    scenario.holder = holder
    wait_for(holder.record, timeout=60)
    scenario.contenders = Contenders(lambda name: wrapper(url, table, tmp_path, name, seconds=0.5))
    # From the promotion until the delay ends (DELAY_TTL after the first lock taken
    # on the new timeline), check names it: "... starts a lock delay after
    # failover", then "lock delay after failover: each key waits for ...".
    # Checks run back to back from the crash on, so that one falls in that window
    # however long a check takes to start on a loaded machine (less than DELAY_TTL).
    shown = threading.Event()

    def check_until_shown() -> None:
        deadline = time.monotonic() + 120
        while not shown.is_set() and time.monotonic() < deadline:
            if "lock delay after failover" in check(url, table).stdout:
                shown.set()

    checks = threading.Thread(target=check_until_shown, daemon=True)
    crash_leader_and_wait(cluster, scenario, then=checks.start)
    poll(shown.is_set, 120, "dislockctl check to show the lock delay")
    holder.wait()
    holder_end = time.time()
    poll(
        lambda: scenario.contenders and scenario.contenders.ran_after(holder_end),
        90,
        "a contender to run after the holder",
    )
    runs, found = scenario.finish()
    assert found == []
    assert holder.process.returncode in (0, 75), holder.stderr
    assert [run.process.returncode for run in runs if run.process.returncode] == []


def test_a_frozen_leader_demoted_when_it_wakes_lets_no_one_overlap(
    cluster: PatroniCluster, table: str, tmp_path: Path, scenario: Scenario
) -> None:
    """The leader's Patroni and PostgreSQL are stopped (SIGSTOP) past Patroni's ttl:
    the clients see a partition, a replica takes over; then they are continued and
    Patroni demotes the old leader (on etcd's v2 API, see tests.support.patroni).
    No two commands overlap, including in the moment the old leader is awake and
    still a primary.  The URL names the frozen leader first, so that every client
    meets the partition (the connection is accepted by the kernel, then nothing)."""
    old = cluster.leader()
    assert old is not None
    url = cluster.url_trying_first(old)
    warm_up(cluster, url, table, tmp_path)
    holder = wrapper(url, table, tmp_path, "holder", seconds=60.0)
    scenario.holder = holder
    wait_for(holder.record, timeout=60)
    scenario.contenders = Contenders(lambda name: wrapper(url, table, tmp_path, name, seconds=0.5))
    frozen = cluster.freeze(old)
    try:
        wait_new_leader(cluster, old, timeout=PATRONI_TTL + 90)
    finally:
        cluster.thaw(frozen)
    woke = time.monotonic()
    poll(lambda: old.rest("/primary")[0] not in (0, 200), 60, f"{old.name} to be demoted")
    scenario.notes.append(f"demoted <= {time.monotonic() - woke:.2f} s after waking")
    holder.wait()
    holder_end = time.time()
    poll(
        lambda: scenario.contenders and scenario.contenders.ran_after(holder_end),
        90,
        "a contender to run after the holder",
    )
    runs, found = scenario.finish()
    assert found == []
    assert holder.process.returncode in (0, 75), holder.stderr
    # A contender may take the lease on the woken leader in the moment before Patroni
    # demotes it, and find it gone on the new primary: stopped, exit 75, as a lost
    # lease should be (the lock delay kept everyone else out meanwhile). No contender
    # fails: the partition is waited out within the connect patience.
    failed = [run.process.returncode for run in runs if run.process.returncode not in (0, 75)]
    assert failed == [], [run.stderr[-300:] for run in runs if run.process.returncode == 1]


def after_the_holder(scenario: Scenario, holder: Run) -> tuple[list[Run], list[Overlap]]:
    """Once the holder ended and a contender ran after it: every run, every overlap."""
    holder.wait()
    holder_end = time.time()
    poll(
        lambda: scenario.contenders and scenario.contenders.ran_after(holder_end),
        90,
        "a contender to run after the holder",
    )
    return scenario.finish()


def ran_or_refused(runs: list[Run]) -> list[str]:
    """The contenders that neither ran (exit 0, or 75: the lease taken on a primary
    about to be demoted was lost under the command) nor were refused (exit 0, the
    conflict exit code): each one's exit and the end of its stderr."""
    return [
        f"{run.record.stem} exit {run.process.returncode}: {run.stderr.strip()[-400:]}"
        for run in runs
        if run.process.returncode not in (0, 75)
    ]


def watch_demotion(cluster: PatroniCluster, old: Node, since: float, *, haproxy: bool) -> list[str]:
    """Until a leader other than ``old`` accepts writes: when (seconds after
    ``since``) ``old``'s Patroni stopped answering ``/primary`` with 200, when HAProxy
    (with ``haproxy``) marked it down, and when the new leader was promoted."""
    marks: dict[str, float] = {}
    deadline = time.monotonic() + PATRONI_TTL + 90
    while cluster.leader(besides=old) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited for a leader other than {old.name}")
        now = time.monotonic() - since
        if "demoted" not in marks and old.rest("/primary", timeout=1.0)[0] != 200:
            marks["demoted"] = now
        states = cluster.haproxy_states() if haproxy else {}
        if states and "unrouted" not in marks and states.get(old.name, "DOWN") == "DOWN":
            marks["unrouted"] = now
        time.sleep(0.1)
    marks["promoted"] = time.monotonic() - since
    words = {"demoted": "demoted", "unrouted": "HAProxy marked it down", "promoted": "promoted"}
    return [f"{words[k]} {v:.1f} s after the cut" for k, v in marks.items()]


@pytest.mark.parametrize("through", ["multi-host URL", "HAProxy"])
def test_a_leader_cut_off_from_etcd_fails_no_contender(
    cluster: PatroniCluster, table: str, tmp_path: Path, scenario: Scenario, through: str
) -> None:
    """The leader's Patroni loses etcd (its proxy to etcd swallows everything), its
    PostgreSQL still reachable: Patroni demotes it once it cannot renew the leader
    key (``retry_timeout``), a replica is promoted once the key expires (``ttl``).
    Meanwhile clients meet the demoted old primary's read-only answers (the URL names
    it first; HAProxy routes to it until its check marks it down) and then no primary
    at all: both ridden out within the wrapper's default connect patience (30 s).
    No two commands overlap; every contender ran or was refused, none exits 1."""
    old = cluster.leader()
    assert old is not None
    url = cluster.url_trying_first(old)
    if through == "HAProxy":
        cluster.start_haproxy()
        url = cluster.haproxy_url
    warm_up(cluster, url, table, tmp_path)
    holder = wrapper(url, table, tmp_path, "holder", seconds=60.0)
    scenario.holder = holder
    wait_for(holder.record, timeout=60)
    scenario.contenders = Contenders(
        lambda name: wrapper(url, table, tmp_path, name, seconds=0.5, CRONJOB_LOCK_LOG_LEVEL="INFO")
    )
    cut = time.monotonic()
    cluster.cut_from_etcd(old)
    try:
        scenario.notes += watch_demotion(cluster, old, cut, haproxy=through == "HAProxy")
    finally:
        cluster.heal()
    runs, found = after_the_holder(scenario, holder)
    assert found == []
    assert holder.process.returncode in (0, 75), holder.stderr
    assert ran_or_refused(runs) == []


@pytest.fixture
def strict_synchronous_mode(cluster: PatroniCluster) -> Iterator[None]:
    """Patroni's ``synchronous_mode`` and ``synchronous_mode_strict`` for one test: a
    commit on the primary waits for its synchronous standby, the only node Patroni
    promotes.  Turned off again afterwards, once a leader is back."""
    cluster.patch_config({"synchronous_mode": True, "synchronous_mode_strict": True})
    cluster.wait_for(
        lambda: any(m.get("role") == "sync_standby" for m in cluster.members()),
        60,
        "a synchronous standby",
    )
    try:
        yield
    finally:
        cluster.wait_for(lambda: cluster.leader() is not None, 120, "a leader")
        cluster.patch_config({"synchronous_mode": False, "synchronous_mode_strict": False})
        cluster.wait_for(
            lambda: all(m.get("role") != "sync_standby" for m in cluster.members()),
            60,
            "no synchronous standby",
        )


@pytest.mark.usefixtures("strict_synchronous_mode")
def test_a_frozen_agent_under_strict_synchronous_mode_fails_no_contender(
    cluster: PatroniCluster, table: str, tmp_path: Path, scenario: Scenario
) -> None:
    """The leader's Patroni alone is stopped (SIGSTOP), its PostgreSQL runs on,
    unmanaged, and accepts connections as a primary; the synchronous standby is
    promoted once the leader key expires.  The old primary can then commit nothing
    (its synchronous standby left it): the holder's renewals fail and it stops at its
    deadline; contenders, each choosing a host at random, are handed back their
    unconfirmed acquisitions there (and on the new primary until the third node
    streams to it) and ride that out within the default connect patience.  The agent
    stays frozen until a contender ran on the new primary, then wakes and demotes
    its server.  No two commands overlap; every contender ran or was refused."""
    holder, old = frozen_agent(cluster, table, tmp_path, scenario)
    poll(lambda: old.rest("/primary")[0] not in (0, 200), 60, f"{old.name} to be demoted")
    runs, found = after_the_holder(scenario, holder)
    assert found == []
    assert holder.process.returncode in (0, 75), holder.stderr
    assert ran_or_refused(runs) == []


def test_a_frozen_agent_with_asynchronous_replication_splits_the_lock(
    cluster: PatroniCluster, table: str, tmp_path: Path, scenario: Scenario
) -> None:
    """What strict synchronous mode (or Patroni's watchdog) prevents, measured: the
    same frozen agent with asynchronous replication.  The old primary runs on as a
    primary, the holder renews there; the promoted replica grants the lease to a
    contender once the lock delay is over: two holders at once, until the agent
    wakes and demotes its server.  dislock cannot see this (two servers, each
    consistent); docs/guarantees.md says so."""
    holder, old = frozen_agent(cluster, table, tmp_path, scenario)
    poll(lambda: old.rest("/primary")[0] not in (0, 200), 60, f"{old.name} to be demoted")
    _, found = after_the_holder(scenario, holder)
    assert any("holder" in pair for pair in found), "the lock did not split: no measurement"


def frozen_agent(
    cluster: PatroniCluster, table: str, tmp_path: Path, scenario: Scenario
) -> tuple[Run, Node]:
    """A holder and contenders on ``random_url``; the leader's agent frozen until a
    leader other than it is promoted and a contender ran after that; the holder and
    the old leader."""
    old = cluster.leader()
    assert old is not None
    url = cluster.random_url
    warm_up(cluster, url, table, tmp_path)
    holder = wrapper(url, table, tmp_path, "holder", seconds=60.0)
    scenario.holder = holder
    wait_for(holder.record, timeout=60)
    scenario.contenders = Contenders(
        lambda name: wrapper(url, table, tmp_path, name, seconds=0.5, CRONJOB_LOCK_LOG_LEVEL="INFO")
    )
    frozen_at = time.monotonic()
    frozen = cluster.freeze_agent(old)
    try:
        wait_new_leader(cluster, old, timeout=PATRONI_TTL + 90)
        promoted = time.time()
        scenario.notes.append(f"promoted {time.monotonic() - frozen_at:.1f} s after the freeze")
        poll(
            lambda: scenario.contenders and scenario.contenders.ran_after(promoted),
            90,
            "a contender to run on the new primary while the old agent is frozen",
        )
        scenario.notes.append(f"agent frozen {time.monotonic() - frozen_at:.1f} s")
    finally:
        cluster.thaw(frozen)
    return holder, old


ACQUIRED = re.compile(r"acquired schedule slot \S+ until (\S+)")


def test_no_schedule_slot_starts_twice_across_a_crash(
    cluster: PatroniCluster, table: str, tmp_path: Path, scenario: Scenario
) -> None:
    """Schedule slots of 5 s, a wrapper every 0.5 s (at most four at once), the
    leader crashes: every slot that started, started once (by the slot each wrapper
    logged it took, and by the commands that ran)."""
    url = cluster.url
    warm_up(cluster, url, table, tmp_path)

    def slot_wrapper(name: str) -> Run:
        return wrapper(
            url,
            table,
            tmp_path,
            name,
            seconds=0.2,
            key="slots",
            LOCK_STRATEGY="schedule",
            CRON_SCHEDULE="* * * * * */5",
            CRON_TZ="UTC",
            CRONJOB_LOCK_LOG_LEVEL="INFO",
        )

    def slots_taken(after: float = 0.0) -> list[str]:
        taken = []
        for run in list(wrappers.runs):
            if run.process.poll() is None or run.started < after:
                continue
            taken += ACQUIRED.findall(run.stderr)
        return taken

    wrappers = scenario.contenders = Contenders(slot_wrapper)
    poll(lambda: slots_taken(), 90, "a slot taken before the crash")
    crash_leader_and_wait(cluster, scenario)
    promoted = time.time()
    poll(lambda: len(set(slots_taken(promoted))) >= 2, 90, "two slots taken after the failover")
    runs, _ = scenario.finish()
    taken = slots_taken()
    twice = sorted({slot for slot in taken if taken.count(slot) > 1})
    commands = sum(run.interval is not None for run in runs)
    print(f"  slots taken {len(set(taken))}, started twice {twice}, commands run {commands}")
    assert twice == []
    assert commands == len(taken)  # every command that ran had a slot of its own
    # A wrapper whose slot ended while no primary answered says so in one line, in the
    # operator's words (the slot, how long the database was unreachable), and exits 1.
    for run in runs:
        if run.process.returncode == 0:
            continue
        assert run.process.returncode == 1, run.stderr
        assert "Traceback" not in run.stderr
        said = [line for line in run.stderr.splitlines() if "unreachable" in line]
        assert len(said) == 1, run.stderr
        assert "the schedule slot of 'slots' ending " in said[0], said[0]
        assert " ended while the database was unreachable for " in said[0], said[0]
        assert "the command did not run" in said[0], said[0]
