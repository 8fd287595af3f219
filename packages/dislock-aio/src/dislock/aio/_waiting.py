"""Waiting, woken by ``LISTEN`` on a connection of its own (``Listener``) or by
polling where no notification can reach us: for a lease held elsewhere
(``wait_for_release``), and for the keys a schedule slot comes after
(``wait_after``: ``LockContext.after`` with ``wait_seconds``).

A release's wake-up is a hint (``_until_free``).  What a slot waits for, and the
wake-up a success sends, are ``dislock.core.after``'s; how long to wait and how
often to poll, ``dislock.core.waiting``'s.
"""

from __future__ import annotations

import contextlib
import logging
from time import monotonic
from typing import TypeVar

from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg.sql import SQL, Identifier

from dislock.core.after import DependencyPending, listen_after
from dislock.core.context import LockContext
from dislock.core.dsn import connection_kwargs, scrub
from dislock.core.exchange import Exchange
from dislock.core.history import history_table
from dislock.core.observing import note
from dislock.core.patience import ConnectPatience
from dislock.core.waiting import (
    WAKE_CHANNEL,
    WAKE_READ_TIMEOUT,
    ListenRow,
    WaitPlan,
    WakeReads,
    held_query,
    listen,
    read_held,
    slot_keys,
)

from ._compat import Takes, sleep
from ._hub import Hub, enter_hub

logger = logging.getLogger("dislock")

Taken = TypeVar("Taken")


class Listener:
    """A direct connection of its own that ``LISTEN``s for a wake-up.

    Behind a pooler in transaction mode the ``LISTEN`` would land on a server
    connection soon serving someone else: ``open`` finds a pooler by the backend
    process id of its own making it answers the startup with.  The payload waited
    for is the server's own making too (``dislock.core.waiting.listen``), so that it
    is the one a release sends, whatever names the table.
    """

    def __init__(self, conn: AsyncConnection[TupleRow], wake: str, what: str, url: str) -> None:
        self.conn = conn
        self.wake = wake
        self.what = what  # what it is woken by, as the log says it
        self.url = url  # to scrub from the errors it logs

    @classmethod
    async def open(
        cls, context: LockContext, exchange: Exchange[ListenRow], what: str
    ) -> Listener | None:
        """A connection woken by ``what``, unless only polling can work
        (``LockContext.wait_listen``, or a pooler found in between).  ``exchange``
        (``dislock.core.waiting.listen``) answers the backend pid and the payload."""
        if context.wait_listen is False:
            return None
        try:
            kwargs = connection_kwargs(context.url, context.connect_timeout_seconds)
            conn = await AsyncConnection.connect(context.url, **kwargs)
            try:
                cursor = await conn.execute(exchange.query, exchange.params)
                found = exchange.read(await cursor.fetchall())
                if context.wait_listen is None and found.backend_pid != conn.info.backend_pid:
                    await conn.close()
                    return None
                await conn.execute(SQL("LISTEN {}").format(Identifier(WAKE_CHANNEL)))
            except BaseException:
                await conn.close()
                raise
        except Exception as exc:
            logger.warning(
                "cannot listen for %s, polling instead: %s", what, scrub(str(exc), context.url)
            )
            return None
        return cls(conn, found.wake, what, context.url)

    async def give_up(self, error: Exception) -> None:
        """Listening failed while waiting: say so and close; the caller polls from now on."""
        logger.warning(
            "stopped listening for %s, polling instead: %s", self.what, scrub(str(error), self.url)
        )
        await self.close()

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for a release of our lease; whether one came.  The
        notifications already received with it are dropped (``drain``): one
        wake-up stands for them all."""
        deadline = monotonic() + timeout
        while True:
            left = deadline - monotonic()
            if left <= 0:
                return False
            notifies = self.conn.notifies(timeout=left)
            try:
                async for notify in notifies:
                    if notify.payload == self.wake:
                        break
                else:
                    continue
            finally:
                # Closed now: it holds the connection until it ends.
                if True:  # ASYNC
                    await notifies.aclose()
                else:
                    notifies.close()
            await self.drain()
            return True

    async def drain(self) -> None:
        """Drop the notifications received so far, without waiting for more."""
        async for _ in self.conn.notifies(timeout=0):
            pass

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.conn.close()


async def wait_for_release(
    context: LockContext, attempt: Takes[[], Taken | None], patience: ConnectPatience
) -> Taken | None:
    """Try again whenever the lease may have been released, until the wait is over:
    what ``attempt()`` (one try: None while the lease is held elsewhere) took, or None."""
    plan = WaitPlan(
        context.wait_seconds, started_at=monotonic(), poll_seconds=context.wait_poll_seconds
    )
    listen_to = listen(context.table_parts, context.lock_key, context.lease_mode)
    listener = await Listener.open(context, listen_to, "releases")
    how = "woken by releases" if listener is not None else "polling"
    logger.info(
        "lease %r is held; waiting up to %g s (%s)", context.lock_key, context.wait_seconds, how
    )
    note("wait", reason="lease held", seconds=context.wait_seconds)
    waited_from: float | None = None
    reads = WakeReads()
    async with enter_hub(context.url, context.connect_timeout_seconds) as hub:
        try:
            while True:
                if waited_from is not None:
                    # Waiting for the holder does not spend the patience with the database.
                    patience.postpone(monotonic() - waited_from)
                # A release between the last try and the LISTEN would be missed:
                # so the LISTEN comes first, then the try.
                taken = await attempt()
                if taken is not None:
                    return taken
                delay = plan.next_delay(monotonic(), listening=listener is not None)
                if delay is None:
                    return None
                waited_from = monotonic()
                if listener is None:
                    await sleep(delay)
                    continue
                try:
                    await _until_free(context, hub, listener, waited_from + delay, reads)
                except Exception as exc:
                    await listener.give_up(exc)
                    listener = None
        finally:
            if listener is not None:
                await listener.close()


async def _until_free(
    context: LockContext, hub: Hub, listener: Listener, poll_at: float, reads: WakeReads
) -> None:
    """Return when a wake-up found a row of the lease free, or at ``poll_at``.  Anyone
    may send the wake-up (``NOTIFY`` needs no right on the table), so each is checked
    with a read by primary key rather than the acquiring statement; the wake-ups that
    arrive while it is read, or less than ``WAKE_SPACING`` after the last read, are
    read once, together (``WakeReads``)."""
    while True:
        left = poll_at - monotonic()
        if left <= 0 or not await listener.wait(left):
            return  # time to poll
        pause = reads.pause(monotonic())
        if pause > 0:
            if pause >= poll_at - monotonic():
                await sleep(max(0.0, poll_at - monotonic()))
                return  # the poll comes first
            await sleep(pause)
            await listener.drain()  # what came meanwhile is read below
        # Never past the poll: a wake-up just before the wait ends must not delay its last try.
        held = await _still_held(context, hub, min(WAKE_READ_TIMEOUT, poll_at - monotonic()))
        reads.read(monotonic())
        if not held:
            return


async def _still_held(context: LockContext, hub: Hub, timeout: float) -> bool:
    """Whether every row of the lease is live, read on the shared connection.  False
    when the read fails: then the lease is tried, whose statement waits out a
    connection that failed and says what went wrong."""
    keys = slot_keys(context.lock_key, context.slots, context.lease_mode)
    params = {"keys": keys, "slots": context.slots}
    exchange = Exchange(held_query(tuple(context.table_parts)), params, read_held)
    try:
        return await hub.ask(exchange, timeout)
    except Exception as exc:
        logger.debug("reading the lease after a wake-up failed: %s", scrub(str(exc), context.url))
        return False


async def wait_after(
    context: LockContext, claim: Takes[[], Taken], patience: ConnectPatience
) -> Taken:
    """``claim()``'s answer, tried again while it raised ``DependencyPending``,
    whenever the key it named may have succeeded, until the wait is over (then the
    last refusal is raised)."""
    plan = WaitPlan(
        context.wait_seconds, started_at=monotonic(), poll_seconds=context.wait_poll_seconds
    )
    table = history_table(context.table_parts, context.history_table)
    listener: Listener | None = None
    listened: str | None = None
    waited_from: float | None = None
    try:
        while True:
            if waited_from is not None:
                # Waiting for another job does not spend the patience with the database.
                patience.postpone(monotonic() - waited_from)
            try:
                return await claim()
            except DependencyPending as pending:
                if pending.key != listened:
                    # A success between the check and the LISTEN would be missed: so
                    # the LISTEN comes first, then the check again.
                    if waited_from is None:
                        logger.info("%s; waiting up to %g s", pending, context.wait_seconds)
                        note("wait", reason=str(pending), seconds=context.wait_seconds)
                    if listener is not None:
                        await listener.close()
                    listen_to = listen_after(table, pending.key)
                    listener = await Listener.open(context, listen_to, "successes")
                    listened = pending.key
                    waited_from = monotonic()
                    continue
                delay = plan.next_delay(monotonic(), listening=listener is not None)
                if delay is None:
                    raise
            waited_from = monotonic()
            if listener is None:
                await sleep(delay)
                continue
            try:
                await listener.wait(delay)
            except Exception as exc:
                await listener.give_up(exc)
                listener = None
    finally:
        if listener is not None:
            await listener.close()
