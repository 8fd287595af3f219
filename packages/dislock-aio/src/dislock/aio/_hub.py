"""One connection and one renewer per database, shared by every lock of the process.

Hand-written in ``dislock/aio/_hub.py``; ``dislock/_sync/_hub.py`` is
generated from it by ``tools/async_to_sync.py``.

``Hub`` is the connection's life: locks run their statements on the hub's
connection, which is opened on first use and closed when the last lock (or
``keep_connected`` scope) using it leaves; a connection that fails or stops
answering is retired and the next statement opens a new one.  ``Renewer`` is the
leases' life: leases register with it, its renewer renews all of them with one
statement per tick and table (see ``dislock.core.renewal``) on the hub's
connection, and its watchdog declares each lease lost at its own local
deadline, even while a renewal hangs on a dead network.
"""

from __future__ import annotations

import logging
import math
import select
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from time import monotonic
from typing import Any

from psycopg import AsyncCursor, OperationalError
from psycopg.rows import TupleRow
from psycopg.sql import SQL, Composed

from dislock.core import sql
from dislock.core.context import DEFAULT_CONNECT_TIMEOUT
from dislock.core.dsn import (
    connection_kwargs,
    error_line,
    host_count,
    longest_connect_timeout,
    parse_dsn,
    scrub,
)
from dislock.core.errors import StatementTimeout
from dislock.core.failover import CURRENT_TIMELINE, timeline_change
from dislock.core.patience import ConnectPatience
from dislock.core.preparing import (
    BACKEND_PID,
    PREPARED_STATEMENT_ERRORS,
    Preparation,
    prepare_threshold,
)
from dislock.core.renewal import (
    Batch,
    Renewal,
    RenewalPlan,
    count_failure,
    failure_summary,
    new_deadlines,
    recovery_summary,
    report_renewal,
)
from dislock.core.supervision import LOSS_LOGGER
from dislock.core.timeouts import CANCEL_GRACE, RENEWER_STOP_TIMEOUT

from ._compat import (
    Event,
    Link,
    Lock,
    Worker,
    local_registry,
    sleep,
    spawn,
    stop_worker,
)
from ._compat import wait_event as wait_event

# if sync
# from dislock.core.errors import NotSent
# from dislock.core.timeouts import STATEMENT_FLOOR
# endif

logger = logging.getLogger("dislock")
loss_logger = logging.getLogger(LOSS_LOGGER)


def _answered_while_idle(link: Link) -> bool:
    """Whether an idle connection has something to read: the server only speaks
    unasked to say goodbye (an idle-session timeout, a terminated backend, a
    restart), so the connection is not worth sending a statement on."""
    if not link.idle:
        return False
    try:
        readable, _, _ = select.select([link.conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _sleep_for(wait: float | None, planned: float, now: float) -> float | None:
    """How long a worker sleeps: ``wait``, until its next job, or, with none left,
    until the wake it had already planned.  Then a lease taken and released before
    that (a short lock's whole life, its release unregistering it before the
    statement) never wakes the worker: ``Renewer.register`` wakes only a worker that
    would otherwise sleep past what the new lease needs, and one sleeping for ever
    always would."""
    if wait is None and now < planned < math.inf:
        return planned - now
    return wait


def _leases(batch: Batch) -> str:
    renewals = batch.renewals
    return f"lease {renewals[0].key}" if len(renewals) == 1 else f"{len(renewals)} leases"


class Hub:
    """The shared connection to one database, and (in ``renewer``) the renewer and
    watchdog of the leases held on it."""

    def __init__(self, url: str, connect_timeout: float) -> None:
        self.url = url
        self.connect_timeout = connect_timeout
        # What a patient try needs to share its time among the URL's hosts.
        self._hosts = host_count(url)
        self._longest_connect = longest_connect_timeout(url, connect_timeout)
        self.users = 0
        """Locks and ``keep_connected`` scopes using the hub (guarded by the registry)."""
        self.renewer = Renewer(self)
        # Guards which link is current: the renewer retires links while locks
        # open new ones; never held across I/O.
        self._guard = threading.Lock()
        self._link: Link | None = None
        self._connecting = Lock()
        self.timeline: int | None = None
        """The server timeline a lock was last taken on (see ``dislock.core.failover``)."""
        self._preparation: tuple[Link, Preparation] | None = None
        """The current link's statement count, until it may prepare (``dislock.core.preparing``)."""

    async def execute(
        self,
        statement: Composed | SQL,
        params: dict[str, Any],
        timeout: float,
        patience: ConnectPatience | None = None,
    ) -> AsyncCursor[TupleRow]:
        """Run one statement on the shared connection, cancelling it after ``timeout``;
        a connection opened for it waits out failures within ``patience`` (that of the
        acquisition the statement is part of), if given."""
        # if sync
        # started = monotonic()
        # endif
        link = await self._usable_link(patience)
        await self._allow_preparing(link)
        # Read before sending: another thread may turn preparing off meanwhile.
        preparing = link.conn.prepare_threshold is not None
        try:
            try:
                return await link.execute(statement, params, timeout)
            except PREPARED_STATEMENT_ERRORS as exc:
                if not preparing:
                    raise
                # Refused before it ran: safe to send again, unprepared.
                self._stop_preparing(link, exc)
                return await link.execute(statement, params, timeout)
        # if async
        # (Statements on one asyncio connection queue inside psycopg, none is
        # ever refused unsent: only the sync flavour retries, below.)
        # endif
        # if sync
        # except NotSent:
        #     # It waited for a connection stuck in another thread's statement and
        #     # was never sent, so it is safe to send again: on a new connection,
        #     # in the time left.
        #     self._retire(link)
        #     link = self._usable_link(patience)
        #     left = timeout - (monotonic() - started)
        #     return link.execute(statement, params, max(left, STATEMENT_FLOOR))
        # endif
        except Exception as exc:
            if isinstance(exc, StatementTimeout) or link.conn.broken or link.conn.closed:
                await self._retire(link)
            raise

    async def connect(self) -> None:
        """Open the shared connection now if it is not open."""
        await self._usable_link()

    async def connect_patiently(self, patience: ConnectPatience) -> None:
        """Have the shared connection open, waiting out failures that say nothing
        about the lock (too many connections, a restarting server, a host that does
        not answer, no primary yet) until ``patience``'s deadline; other failures,
        and the last one, are raised."""
        await self._usable_link(patience)

    async def _usable_link(self, patience: ConnectPatience | None = None) -> Link:
        """The current link, or a new one if it is unusable (a failure to open one is
        retried within ``patience``, if given)."""
        link = self._link
        if link is not None and self._usable(link):
            return link
        if patience is None:
            return await self._reopen(None)
        while True:
            started = monotonic()
            try:
                timeout = patience.attempt_timeout(self._longest_connect, self._hosts, started)
                return await self._reopen(timeout)
            except OperationalError as exc:
                now = monotonic()
                detail = scrub(" ".join(str(exc).split()), self.url)
                delay = patience.next_delay(exc, now, attempt_started=started)
                if delay is None:
                    unreachable = patience.unreachable(exc, detail, now)
                    if unreachable is None:
                        raise
                    raise unreachable from exc
                logger.info("could not connect, retrying in %.2f s: %s", delay, detail)
            await sleep(delay)

    async def _reopen(self, attempt_timeout: float | None) -> Link:
        """Open a link unless another user just did (``attempt_timeout``: see
        ``connection_kwargs``)."""
        async with self._connecting:
            link = self._link
            if link is None or not self._usable(link):
                if link is not None:
                    await self._retire(link)
                kwargs = connection_kwargs(
                    self.url, self.connect_timeout, attempt_timeout=attempt_timeout
                )
                link = await Link.open(self.url, kwargs)
                with self._guard:
                    self._link = link
                    self._preparation = (link, Preparation())
                if self.timeline is not None and self.renewer.holds_leases():
                    await self._compare_timeline(link)
            return link

    async def _allow_preparing(self, link: Link) -> None:
        """Once ``link`` has served a few statements, let psycopg prepare the ones it
        repeats if it reaches the server directly (``dislock.core.preparing``).  Checked
        before a statement, not after: an interruption here leaves that one unsent."""
        counted = self._preparation
        if counted is None or counted[0] is not link or not counted[1].check_due():
            return
        try:
            cursor = await link.execute(BACKEND_PID, {}, self.connect_timeout)
            row = await cursor.fetchone()
        except Exception as exc:  # the statement that follows finds out, if it matters
            logger.debug("could not read the server's backend pid: %s", scrub(str(exc), self.url))
            return
        threshold = prepare_threshold(link.conn.info.backend_pid, None if row is None else row[0])
        link.conn.prepare_threshold = threshold
        if threshold is None:
            logger.debug("a pooler is in between: statements stay unprepared")
        else:
            logger.debug("direct connection: repeated statements are prepared")

    def _stop_preparing(self, link: Link, exc: Exception) -> None:
        """Never prepare on ``link`` again: something between here and the server (a
        pooler that passes the server's backend pid on) lost a prepared statement."""
        link.conn.prepare_threshold = None
        logger.warning(
            "the server lost a prepared statement (%s); statements on this connection"
            " stay unprepared from now on",
            scrub(" ".join(str(exc).split()), self.url),
        )

    def note_timeline(self, timeline: object) -> None:
        if isinstance(timeline, int):
            self.timeline = timeline

    async def _compare_timeline(self, link: Link) -> None:
        """A holder reconnecting: say so if the server's history changed (one
        statement per reconnection, none on the common path)."""
        try:
            cursor = await link.execute(CURRENT_TIMELINE, {}, self.connect_timeout)
            row = await cursor.fetchone()
        except Exception as exc:  # a standby, a server without WAL functions
            logger.debug("could not read the server timeline: %s", scrub(str(exc), self.url))
            return
        now = None if row is None else row[0]
        warning = timeline_change(self.timeline, now)
        if warning:
            logger.warning("%s", warning)
        self.note_timeline(now)

    def _usable(self, link: Link) -> bool:
        conn = link.conn
        return not (
            link.retired or conn.closed or conn.broken or link.overdue or _answered_while_idle(link)
        )

    async def _retire(self, link: Link) -> None:
        with self._guard:  # a link just opened by another thread stays current
            if self._link is link:
                self._link = None
        await link.retire()

    # What the locks ask of the renewer.

    def register(self, renewal: Renewal, lost: Event) -> None:
        """Keep ``renewal`` alive until ``unregister``; set ``lost`` if it cannot be."""
        self.renewer.register(renewal, lost)

    def unregister(self, renewal: Renewal) -> None:
        self.renewer.unregister(renewal)

    def declare_lost(self, renewal: Renewal) -> None:
        self.renewer.declare_lost(renewal)

    async def close(self) -> None:
        await self.renewer.stop()
        with self._guard:
            link, self._link = self._link, None
        if link is not None:
            await link.retire()


class Renewer:
    """The renewer and the watchdog of one hub's leases.

    The renewer sends the due batches on the hub's connection and sleeps until
    the next lease is due; the watchdog declares each lease lost at its local
    deadline, whatever the renewer is doing, and replaces a renewer stuck in a
    statement.  Both live as long as the hub, so that taking and releasing
    leases starts no worker each time.  Everything they share with each other
    and with the locks' threads is under ``_guard``, which is never held across
    I/O or a wait.
    """

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self._guard = threading.Lock()
        # Under the guard:
        self.plan = RenewalPlan()
        self._lost_events: dict[Renewal, Event] = {}
        self._renewer: Worker | None = None
        self._watchdog: Worker | None = None
        self._abandoned: list[Worker] = []
        self._generation = 0
        self._closing = False
        self._renewer_wakes_at = math.inf
        self._watchdog_wakes_at = math.inf
        self._sending_since: float | None = None
        self._sending_for = 0.0
        # Events are safe to set from any thread (and wake their waiters).
        self._renew_wake = Event()
        self._watch_wake = Event()

    def holds_leases(self) -> bool:
        with self._guard:
            return bool(len(self.plan))

    def register(self, renewal: Renewal, lost: Event) -> None:
        """Keep ``renewal`` alive until ``unregister``; set ``lost`` if it cannot be."""
        with self._guard:
            self._lost_events[renewal] = lost
            self.plan.add(renewal)
            if self._renewer is None:
                self._start_renewer()
            if self._watchdog is None:
                self._watchdog = spawn(self._watch, "dislock-deadline")
            # Wake a worker only if it would sleep past what this lease needs:
            # waking threads costs more than the statements of a short lock.
            wake_renewer = renewal.clock.next_renewal < self._renewer_wakes_at
            wake_watchdog = renewal.clock.deadline < self._watchdog_wakes_at
            # A woken worker that finds the lease already gone (released before it
            # ran) keeps sleeping until then, not for ever (``_sleep_for``), so that
            # the next short lock does not wake it again.
            if wake_renewer:
                self._renewer_wakes_at = renewal.clock.next_renewal
            if wake_watchdog:
                self._watchdog_wakes_at = renewal.clock.deadline
        if wake_renewer:
            self._renew_wake.set()
        if wake_watchdog:
            self._watch_wake.set()

    def unregister(self, renewal: Renewal) -> None:
        # The workers find out when they next wake; nothing is due sooner.
        with self._guard:
            self.plan.remove(renewal)
            self._lost_events.pop(renewal, None)

    def declare_lost(self, renewal: Renewal) -> None:
        """Set the loss event of ``renewal`` (lost by its clock), logging the
        reason once; nothing once it is unregistered, so that a late verdict on
        one acquisition never reaches the next one of the same lock."""
        summary = None
        with self._guard:
            event = self._lost_events.get(renewal)
            newly = event is not None and not event.is_set()
            if newly:
                assert event is not None
                event.set()
                summary = failure_summary(renewal, monotonic())
        if summary is not None:
            logger.warning("%s", summary)
        if newly:
            loss_logger.warning("lease %s lost: %s", renewal.key, renewal.clock.lost_reason)

    def _declare(self, lost: list[Renewal]) -> None:
        for renewal in lost:
            self.declare_lost(renewal)

    def _start_renewer(self) -> None:
        """(Under the guard.)"""
        self._generation += 1
        self._renewer = spawn(partial(self._renew, self._generation), "dislock-renewer")

    def _current(self, generation: int) -> bool:
        with self._guard:
            return generation == self._generation

    async def _renew(self, generation: int) -> None:
        """Send the due batches, then sleep until the next lease is due (or for
        ever, without leases; ``register`` wakes it)."""
        while True:
            self._renew_wake.clear()
            with self._guard:
                if generation != self._generation:
                    return
                now = monotonic()
                wait = self.plan.until_next(now)
                batches = self.plan.due(now)
                if not batches:
                    wait = _sleep_for(wait, self._renewer_wakes_at, now)
                    self._renewer_wakes_at = math.inf if wait is None else now + wait
            if not batches:
                await wait_event(self._renew_wake, wait)
                continue
            for batch in batches:
                await self._send(batch, generation)

    async def _send(self, batch: Batch, generation: int) -> None:
        statement = sql.statements(batch.table_parts).renew_batch
        sent_at = monotonic()
        timeout = batch.timeout(sent_at)
        with self._guard:
            self._sending_since, self._sending_for = sent_at, timeout
        try:
            cursor = await self.hub.execute(statement, batch.params(), timeout)
            renewed = [(str(key), str(value)) for key, value in await cursor.fetchall()]
        except Exception as exc:
            detail = error_line(exc, self.hub.url)  # kept as the lease's last_error too
            with self._guard:
                if generation != self._generation:
                    return  # replaced while stuck: its successor keeps the books now
                now = monotonic()
                # Counted before the failure is recorded, which may lose the lease.
                first = count_failure(batch, now)
                lost = self.plan.failed(batch, detail, now=now)
                self._sending_since = None
            # The first failure in full; the rest are counted, and summed up in one
            # line once renewals succeed again or the lease is lost.
            logger.log(
                logging.WARNING if first else logging.DEBUG,
                "renewal of %s failed, retrying until %s: %s",
                _leases(batch),
                "its deadline" if len(batch.renewals) == 1 else "their deadlines",
                detail,
            )
        else:
            with self._guard:
                if generation != self._generation:
                    return
                now = monotonic()
                lost = self.plan.settle(batch, sent_at=sent_at, now=now, renewed=renewed)
                recovered = recovery_summary(batch, now)
                self._sending_since = None
                followers = new_deadlines(batch)
            for follow, deadline in followers:
                follow(deadline)
            if recovered is not None:
                logger.warning("%s", recovered)
            took = monotonic() - sent_at
            logger.debug("renewed %s in %.1f ms", _leases(batch), took * 1000)
            report_renewal(batch, took)
        self._declare(lost)

    async def _watch(self) -> None:
        """Declare leases lost at their deadlines, whatever the renewer is doing,
        and replace a renewer stuck in a statement that its cancellation could
        not end (a dead network can swallow the cancel request too)."""
        while True:
            self._watch_wake.clear()
            with self._guard:
                if self._closing:
                    return
                now = monotonic()
                lost = self.plan.expired(now)
                wait = self.plan.until_deadline(now)
                since = self._sending_since
                if since is not None:
                    stuck_at = since + self._sending_for + CANCEL_GRACE
                    if now >= stuck_at:
                        self._replace_stuck_renewer()
                    else:
                        wait = stuck_at - now if wait is None else min(wait, stuck_at - now)
                wait = _sleep_for(wait, self._watchdog_wakes_at, now)
                self._watchdog_wakes_at = math.inf if wait is None else now + wait
            self._declare(lost)
            await wait_event(self._watch_wake, wait)

    def _replace_stuck_renewer(self) -> None:
        """(Under the guard.)"""
        logger.warning("the lease renewer is stuck in a statement; starting another")
        self._sending_since = None
        if self._renewer is not None:
            self._abandoned.append(self._renewer)
        # Its connection is overdue, so the next statement retires it and opens
        # another; the stuck statement closes it if it ever returns.
        self._start_renewer()

    async def stop(self) -> None:
        """End the renewer and the watchdog and wait for them; a worker stuck in a
        statement is left behind."""
        with self._guard:
            self._closing = True
            self._generation += 1
            workers = (self._renewer, self._watchdog, *self._abandoned)
            self._renewer = self._watchdog = None
            self._abandoned = []
        self._renew_wake.set()
        self._watch_wake.set()
        for worker in workers:
            if worker is not None:
                await stop_worker(worker, RENEWER_STOP_TIMEOUT)


# if async
# With asyncio, "the process" means the event loop: a connection belongs to the
# loop that opened it, so each loop has hubs of its own (see ``local_registry``).
# endif
def enter_hub(url: str, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> Hub:
    """The hub for ``url``, counted as used until ``leave_hub``."""
    registry = local_registry()
    with registry.lock:
        hub: Hub | None = registry.hubs.get(url)
        if hub is None:
            hub = registry.hubs[url] = Hub(url, connect_timeout)
        hub.users += 1
        return hub


async def leave_hub(hub: Hub) -> None:
    """Stop using ``hub``; the last user closes its connection."""
    registry = local_registry()
    with registry.lock:
        hub.users -= 1
        if hub.users:
            return
        if registry.hubs.get(hub.url) is hub:
            del registry.hubs[hub.url]
    await hub.close()


@asynccontextmanager
async def keep_connected(
    url: str, *, connect_timeout_seconds: float = DEFAULT_CONNECT_TIMEOUT
) -> AsyncIterator[None]:
    """Keep the shared connection to ``url`` open while the block runs.

    Locks share one connection per database anyway while any of them is held;
    between two locks it is closed.  Inside this block it stays open, so that a
    lock taken and released many times costs two statements each time and no
    new connection.  The URL must be the one the locks' ``LockContext`` uses.
    """
    parse_dsn(url)
    hub = enter_hub(url, connect_timeout_seconds)
    try:
        await hub.connect()  # a bad URL or an unreachable server fails here, not later
        yield
    finally:
        await leave_hub(hub)
