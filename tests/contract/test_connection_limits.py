"""Contract: a server that refuses connections past a cap (here a role's ``CONNECTION
LIMIT``, all of it in use) is waited out, for ``connect_patience_seconds`` at most,
and then reported; the lock is never reported as held elsewhere for it.  The
patience covers every connection on the way to the decision, a link reopened
before the first statement too."""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import dislock._sync._hub
import dislock.aio._hub
from dislock import LockContext
from dislock.core import protocol
from dislock.core.rows import lease_key, schedule_key
from tests.conftest import BARE_TABLES
from tests.support.drivers import AioDriver, Driver, Holding
from tests.support.rows import Rows

MakeContext = Callable[..., LockContext]
LIMIT = 2

# Behind the CI's PgBouncer every client is the pooler's one server role.
pytestmark = pytest.mark.direct_postgres


@pytest.mark.parametrize("strategy", ["lease", "schedule"])
def test_a_lock_waits_for_a_free_connection_then_takes_it(
    driver: Driver, make_context: MakeContext, rows: Rows, limited_url: str, strategy: str
) -> None:
    context = make_context(
        url=limited_url,
        schedule="0 0 1 1 *",
        run_ttl_seconds=10,
        lease_interval_seconds=1,
        connect_patience_seconds=30,
    )
    blockers = [psycopg.connect(limited_url) for _ in range(LIMIT)]
    outcome: list[Holding | BaseException] = []

    def take() -> None:
        try:
            outcome.append(driver.hold(context, [strategy]))
        except BaseException as exc:
            outcome.append(exc)

    taker = threading.Thread(target=take)
    try:
        taker.start()
        time.sleep(1.5)
        assert outcome == []  # still waiting, neither failed nor "held elsewhere"
    finally:
        for blocker in blockers:
            blocker.close()
    taker.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], Holding), outcome
    key = lease_key(context.lock_key) if strategy == "lease" else schedule_key(context.lock_key)
    row = rows.get(key)
    assert row is not None and not row.expired
    outcome[0].release()


@pytest.mark.needs("python-api")
def test_refusals_are_raised_once_the_patience_runs_out(
    driver: Driver, make_context: MakeContext, limited_url: str
) -> None:
    context = make_context(
        url=limited_url, run_ttl_seconds=10, lease_interval_seconds=1, connect_patience_seconds=1.0
    )
    blockers = [psycopg.connect(limited_url) for _ in range(LIMIT)]
    try:
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match="too many connections"):
            driver.hold(context, ["lease"])
        assert time.monotonic() - started >= 1.0
    finally:
        for blocker in blockers:
            blocker.close()


@pytest.mark.needs("python-api")
def test_a_schedule_lock_stops_waiting_when_its_slot_ends(
    driver: Driver, make_context: MakeContext, limited_url: str
) -> None:
    from datetime import datetime, timedelta, timezone

    ends = datetime.now(timezone.utc) + timedelta(seconds=1.0)
    context = make_context(url=limited_url, next_run_time=ends, connect_patience_seconds=60)
    blockers = [psycopg.connect(limited_url) for _ in range(LIMIT)]
    try:
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError, match="too many connections"):
            driver.hold(context, ["schedule"])
        assert time.monotonic() - started < 10  # the slot's end, not the 60 s patience
    finally:
        for blocker in blockers:
            blocker.close()


class RetireFirstLink:
    """Before a hub's first statement: the server ends that connection, its goodbye
    reaches the client (so the hub finds the link unusable and opens another), and
    the role's every connection is taken; they are given back once the reopening
    was refused and said it will retry."""

    def __init__(self, db: psycopg.Connection[Any], url: str) -> None:
        self._db = db
        self._url = url
        self._blockers: list[psycopg.Connection[Any]] = []
        self.retired = threading.Event()
        self.refused = threading.Event()

    def before_statement(self, hub: Any) -> None:
        if self.retired.is_set():
            return
        conn = hub._link.conn
        pid, role = conn.info.backend_pid, conn.info.user
        self._db.execute("SELECT pg_terminate_backend(%s)", [pid])
        deadline = time.monotonic() + 30
        while not select.select([conn.fileno()], [], [], 0.05)[0]:
            assert time.monotonic() < deadline, "the server's goodbye never arrived"
        while self._db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", [role]
        ).fetchone() != (0,):
            assert time.monotonic() < deadline, "the terminated backend never went"
            time.sleep(0.02)
        self._blockers = [psycopg.connect(self._url) for _ in range(LIMIT)]
        self.retired.set()

    def saw(self, message: str) -> None:
        if self.retired.is_set() and not self.refused.is_set() and "retrying" in message:
            self.refused.set()
            self.give_back()

    def give_back(self) -> None:
        for blocker in self._blockers:
            blocker.close()
        self._blockers = []


class _Watcher(logging.Handler):
    def __init__(self, fault: RetireFirstLink) -> None:
        super().__init__(logging.INFO)
        self._fault = fault

    def emit(self, record: logging.LogRecord) -> None:
        self._fault.saw(record.getMessage())


def before_each_statement(
    driver: Driver, monkeypatch: pytest.MonkeyPatch, hook: Callable[[Any, Any], object]
) -> None:
    """Call ``hook(hub, statement)`` before the locks' hub sends each statement, in
    the driver's flavour."""
    if isinstance(driver, AioDriver):
        original_aio = dislock.aio._hub.Hub.execute

        async def execute_aio(self: Any, statement: Any, *args: Any, **kwargs: Any) -> Any:
            hook(self, statement)
            return await original_aio(self, statement, *args, **kwargs)

        monkeypatch.setattr(dislock.aio._hub.Hub, "execute", execute_aio)
    else:
        original = dislock._sync._hub.Hub.execute

        def execute(self: Any, statement: Any, *args: Any, **kwargs: Any) -> Any:
            hook(self, statement)
            return original(self, statement, *args, **kwargs)

        monkeypatch.setattr(dislock._sync._hub.Hub, "execute", execute)


@pytest.fixture
def retire_first_link(
    driver: Driver,
    db: psycopg.Connection[Any],
    limited_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> Iterator[RetireFirstLink]:
    fault = RetireFirstLink(db, limited_url)
    before_each_statement(driver, monkeypatch, lambda hub, _: fault.before_statement(hub))
    caplog.set_level(logging.INFO, logger="dislock")
    watcher = _Watcher(fault)
    logger = logging.getLogger("dislock")
    logger.addHandler(watcher)
    try:
        yield fault
    finally:
        logger.removeHandler(watcher)
        fault.give_back()


# The wrapper runs the sync code this patches, in a process of its own.
@pytest.mark.needs("python-api")
@pytest.mark.parametrize("strategy", ["lease", "schedule"])
def test_a_link_retired_before_the_first_statement_is_reopened_patiently(
    driver: Driver,
    make_context: MakeContext,
    rows: Rows,
    limited_url: str,
    retire_first_link: RetireFirstLink,
    strategy: str,
) -> None:
    context = make_context(
        url=limited_url,
        schedule="0 0 1 1 *",
        run_ttl_seconds=10,
        lease_interval_seconds=1,
        connect_patience_seconds=30,
    )
    holding = driver.hold(context, [strategy])
    try:
        assert retire_first_link.retired.is_set()
        assert retire_first_link.refused.is_set()  # the reopening was refused, and waited
        key = lease_key(context.lock_key) if strategy == "lease" else schedule_key(context.lock_key)
        row = rows.get(key)
        assert row is not None and not row.expired
    finally:
        holding.release()


@pytest.fixture
def sent(driver: Driver, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the locks' hub sends, in order: ``acquire`` for a statement that writes,
    ``read`` for one that only reads (the look at the row)."""
    sent: list[str] = []

    def kind(statement: Any) -> str:
        text = statement.as_string(None)
        return "acquire" if "INSERT INTO" in text or "_dislock_acquire" in text else "read"

    before_each_statement(driver, monkeypatch, lambda _, statement: sent.append(kind(statement)))
    return sent


class _GiveBackOnRetry(logging.Handler):
    """Closes ``blockers`` once a lock says it could not connect and will retry."""

    def __init__(self, blockers: list[psycopg.Connection[Any]]) -> None:
        super().__init__(logging.INFO)
        self.blockers = blockers
        self.refused = False

    def emit(self, record: logging.LogRecord) -> None:
        if "retrying" in record.getMessage() and not self.refused:
            self.refused = True
            for blocker in self.blockers:
                blocker.close()


@pytest.mark.needs("python-api")
@pytest.mark.parametrize("crowded", [False, True], ids=["door-open", "door-crowded"])
def test_a_look_goes_first_only_on_a_connection_opened_through_a_crowded_door(
    driver: Driver,
    make_context: MakeContext,
    rows: Rows,
    limited_url: str,
    sent: list[str],
    crowded: bool,
    lock_table: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lone run finds the server's door open and decides in one round trip: the
    acquiring statement alone.  A run that was refused a connection first (a herd:
    every machine's crontab fired at once) looks at the row before planning the
    acquiring statement, and a live row is refused by that read alone."""
    from dislock import LockNotAcquiredError

    context = make_context(
        url=limited_url, run_ttl_seconds=10, lease_interval_seconds=1, connect_patience_seconds=30
    )
    rows.plant(lease_key(context.lock_key), "another-machine", 600)
    if BARE_TABLES:  # a process that has met the table sends its plain statement alone
        monkeypatch.setattr(protocol, "MISSING", {tuple(lock_table)})
    blockers = [psycopg.connect(limited_url) for _ in range(LIMIT)] if crowded else []
    door = _GiveBackOnRetry(blockers)
    logger = logging.getLogger("dislock")
    logger.addHandler(door)
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        with pytest.raises(LockNotAcquiredError):
            driver.hold(context, ["lease"])
    finally:
        logger.removeHandler(door)
        logger.setLevel(previous)
        for blocker in blockers:
            blocker.close()
    assert door.refused is crowded
    assert sent == (["read"] if crowded else ["acquire"])
    row = rows.get(lease_key(context.lock_key))
    assert row is not None and row.value == "another-machine" and not row.expired
