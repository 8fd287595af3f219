"""One connection and one renewer per database, shared by every lock of the process.

``Hub`` is the connection's life: locks run their statements on the hub's
connection, which is opened on first use and closed when the last lock (or
``keep_connected`` scope) using it leaves; a connection that fails or stops
answering is retired and the next statement opens a new one.  The leases' life
is the hub's ``Renewer`` (``._renewer``).
"""

from __future__ import annotations

import logging
import select
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from functools import partial
from time import monotonic
from typing import Any, cast

from psycopg import AsyncConnection, AsyncCursor, OperationalError
from psycopg.errors import UndefinedFunction
from psycopg.pq import ExecStatus
from psycopg.rows import TupleRow
from psycopg.sql import SQL, Composed

from dislock.core.acquisition import Ask, Connect, Crowded, Given, Outcome, Pause, Steps
from dislock.core.context import DEFAULT_CONNECT_TIMEOUT, LockContext
from dislock.core.dsn import connection_kwargs, learn_password, one_line, parse_dsn, scrub
from dislock.core.errors import NotSent, StatementTimeout
from dislock.core.exchange import Answer, Exchange
from dislock.core.exit_arguments import Exc, ExcType, Tb
from dislock.core.failover import TIMELINE_NOW
from dislock.core.hub_state import HubState
from dislock.core.patience import ConnectPatience, passing_answer
from dislock.core.preparing import PREPARED_STATEMENT_ERRORS, SERVER_PID
from dislock.core.protocol import missing
from dislock.core.renewal import Renewal
from dislock.core.timeouts import STATEMENT_FLOOR
from dislock.core.unknown_outcome import HELD

from ._compat import Link, Lock, local_registry, sleep
from ._renewer import Renewer

logger = logging.getLogger("dislock")

GIVEN = Given(monotonic, partial(datetime.now, timezone.utc), HELD)
"""What the sequences read of the process: its clocks, and its rows."""


class Hub(HubState[Link]):
    """The shared connection to one database and (``renewer``) its leases' renewer;
    its bookkeeping between statements is ``dislock.core.hub_state.HubState``'s."""

    def __init__(self, url: str, connect_timeout: float) -> None:
        super().__init__(url, connect_timeout)
        self.renewer = Renewer(self)
        self._connecting = Lock()

    async def execute(
        self,
        statement: Composed | SQL,
        params: dict[str, Any],
        timeout: float,
        patience: ConnectPatience | None = None,
    ) -> AsyncCursor[TupleRow]:
        """Run one statement on the shared connection, cancelling it after ``timeout``;
        a connection opened for it waits out failures within ``patience``, if given."""
        started = monotonic()
        link = await self.connect(patience)
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
        except NotSent:
            # Only the thread-based link raises it, for a statement that gave up waiting
            # behind another thread's stuck one: unsent, so safe to send again, on a new
            # connection, in the time left.
            await self._retire(link)
            link = await self.connect(patience)
            left = timeout - (monotonic() - started)
            return await link.execute(statement, params, max(left, STATEMENT_FLOOR))
        except Exception as exc:
            # A connection that answered read-only or unconfirmed stays so (a read-only
            # session, a demoting primary a proxy still routes to): a fresh one may not.
            conn, timed_out = link.conn, isinstance(exc, StatementTimeout)
            if timed_out or passing_answer(exc) or conn.broken or conn.closed:
                await self._retire(link)
            raise

    async def ask(
        self, exchange: Exchange[Answer], timeout: float, patience: ConnectPatience | None = None
    ) -> Answer:
        """Send ``exchange`` as ``execute`` does and read its answer from its rows (a
        call to a function the table lacks: its plain statement, ``Exchange.fallback``)."""
        started = monotonic()
        try:
            cursor = await self.execute(exchange.query, exchange.params, timeout, patience)
        except UndefinedFunction:
            if exchange.fallback is None:
                raise
            left = max(timeout - (monotonic() - started), STATEMENT_FLOOR)
            return await self.ask(missing(exchange), left, patience)
        # The result's status, not ``description``: building the columns' descriptions
        # costs more than reading a lock statement's answer.
        result = cursor.pgresult
        answered = result is not None and result.status == ExecStatus.TUPLES_OK
        return exchange.read(await cursor.fetchall() if answered else [])

    async def drive(self, sequence: Steps[Outcome]) -> Outcome:
        """Carry out an acquisition's steps (``dislock.core.acquisition``) to its outcome
        (or the error it raises), deciding nothing.  An interruption closes the sequence
        at the step it was at, rather than leaving it suspended for the garbage collector."""
        reply: Any = None
        error: Exception | None = None
        try:
            while True:
                try:
                    step = sequence.throw(error) if error is not None else sequence.send(reply)
                except StopIteration as done:
                    return cast(Outcome, done.value)
                reply, error = None, None
                if isinstance(step, Ask):
                    try:
                        reply = await self.ask(step.exchange, step.timeout, step.patience)
                    except Exception as exc:  # the sequence decides what each error means
                        error = exc
                elif isinstance(step, Pause):
                    await sleep(step.seconds)
                elif isinstance(step, Connect):
                    await self.connect(step.patience)
                elif isinstance(step, Crowded):
                    reply = self.crowded
                else:
                    self.note_timeline(step.timeline)
        finally:
            sequence.close()

    async def connect(self, patience: ConnectPatience | None = None) -> Link:
        """The shared connection: the current link, or a new one if it is unusable,
        waiting out failures that say nothing about the lock (too many connections, a
        restarting server, no primary yet) until ``patience``'s deadline, if given;
        other failures, and the last one, are raised."""
        link = self._link
        if link is not None and self._usable(link):
            return link
        if patience is None:
            return await self._reopen(None)
        refused = False
        while True:
            started = monotonic()
            try:
                timeout = patience.attempt_timeout(self._longest_connect, self._hosts, started)
                link = await self._reopen(timeout)
                if refused:
                    self._crowded_link = link
                return link
            except OperationalError as exc:
                refused = True
                now = monotonic()
                detail = scrub(one_line(str(exc)), self.url)
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
                link = Link(await AsyncConnection.connect(self.url, **kwargs))
                learn_password(link.conn.info.password)
                self._adopt(link)
                if self.timeline is not None and self.renewer.holds_leases():
                    # A holder reconnecting: say so if the server's history changed
                    # (one statement per reconnection, none on the common path).
                    await self._read(link, TIMELINE_NOW, "the server timeline", self._timeline_read)
            return link

    async def _allow_preparing(self, link: Link) -> None:
        """Once ``link`` has served a few statements, let psycopg prepare the ones it
        repeats if it reaches the server directly (``dislock.core.preparing``).  Checked
        before a statement, not after: an interruption here leaves that one unsent."""
        if self._check_due(link):
            read = partial(self._prepare_if_direct, link)
            await self._read(link, SERVER_PID, "the server's backend pid", read)

    async def _read(
        self, link: Link, exchange: Exchange[Answer], what: str, then: Callable[[Answer], None]
    ) -> None:
        """``then(answer)`` with ``exchange``'s answer on ``link`` itself, within the
        connect timeout; a failure is only logged (the next statement finds out)."""
        try:
            cursor = await link.execute(exchange.query, exchange.params, self.connect_timeout)
            answer = exchange.read(await cursor.fetchall())
        except Exception as exc:
            logger.debug("could not read %s: %s", what, scrub(str(exc), self.url))
            return
        then(answer)

    def _usable(self, link: Link) -> bool:
        conn = link.conn
        if link.retired or conn.closed or conn.broken or link.overdue:
            return False
        if not link.idle:
            return True
        # An idle connection with something to read is not worth sending a statement on:
        # the server only speaks unasked to say goodbye (an idle-session timeout, a
        # terminated backend, a restart).
        try:
            readable, _, _ = select.select([conn.fileno()], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    async def _retire(self, link: Link) -> None:
        self._forget(link)
        await link.retire()

    def declare_lost(self, renewal: Renewal) -> None:
        self.renewer.declare_lost(renewal)

    async def close(self) -> None:
        await self.renewer.stop()
        with self._guard:
            link, self._link = self._link, None
        if link is not None:
            await link.retire()

    async def __aenter__(self) -> Hub:
        return self

    async def __aexit__(self, exc_type: ExcType, exc: Exc, tb: Tb) -> None:
        await leave_hub(self)


# A hub serves one process or, where a connection belongs to the loop that opened
# it, one loop: each loop then has hubs of its own (see ``local_registry``).
def enter_hub(url: str, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> Hub:
    """The hub for ``url``, counted as used until ``leave_hub`` (or the end of the
    block it is entered by)."""
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


async def drive_briefly(context: LockContext, sequence: Steps[Outcome]) -> Outcome:
    """Run ``sequence`` on the hub of ``context``'s database, used only meanwhile."""
    async with enter_hub(context.url, context.connect_timeout_seconds) as hub:
        return await hub.drive(sequence)


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
    async with enter_hub(url, connect_timeout_seconds) as hub:
        await hub.connect()  # a bad URL or an unreachable server fails here, not later
        yield
