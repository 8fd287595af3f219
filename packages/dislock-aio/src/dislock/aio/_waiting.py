"""Waiting for a lease held elsewhere: woken by its release (``LISTEN``), or by
polling where no notification can reach us.  A wake-up is read as a hint: the
lease's rows are read by primary key, and it is tried only when one is free.

Hand-written in ``dislock/aio/_waiting.py``; ``dislock/_sync/_waiting.py`` is
generated from it by ``tools/async_to_sync.py``.  How long to wait and how often
to poll are ``dislock.core.waiting``'s.
"""

from __future__ import annotations

import logging
from time import monotonic
from typing import Protocol, TypeVar

from dislock.core.context import LockContext
from dislock.core.dsn import connection_kwargs, scrub
from dislock.core.exchange import Exchange
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

from ._compat import sleep
from ._hub import Hub, enter_hub, leave_hub
from ._listen import Listener

logger = logging.getLogger("dislock")

Taken = TypeVar("Taken", covariant=True)


class Attempt(Protocol[Taken]):
    """One try at the lease: what it took, or None while it is held elsewhere."""

    async def __call__(self) -> Taken | None: ...


async def wait_for_release(
    context: LockContext, attempt: Attempt[Taken], patience: ConnectPatience
) -> Taken | None:
    """Try again whenever the lease may have been released, until the wait is over:
    what ``attempt`` took, or None."""
    plan = WaitPlan(
        context.wait_seconds, started_at=monotonic(), poll_seconds=context.wait_poll_seconds
    )
    listen_to = listen(context.table_parts, context.lock_key, context.lease_mode)
    listener = await listening(context, listen_to, "releases")
    logger.info(
        "lease %r is held; waiting up to %g s (%s)",
        context.lock_key,
        context.wait_seconds,
        "woken by releases" if listener is not None else "polling",
    )
    waited_from: float | None = None
    reads = WakeReads()
    hub = enter_hub(context.url, context.connect_timeout_seconds)
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
                logger.warning(
                    "stopped listening for releases, polling instead: %s",
                    scrub(str(exc), context.url),
                )
                await listener.close()
                listener = None
    finally:
        if listener is not None:
            await listener.close()
        await leave_hub(hub)


async def _until_free(
    context: LockContext, hub: Hub, listener: Listener, poll_at: float, reads: WakeReads
) -> None:
    """Return when a wake-up found a row of the lease free, or at ``poll_at``.

    Anyone may send the wake-up (``NOTIFY`` needs no right on the table), so each
    is checked with a read by primary key rather than the acquiring statement;
    the wake-ups that arrive while it is read, or less than ``WAKE_SPACING``
    after the last read, are read once, together (``WakeReads``).
    """
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


async def listening(
    context: LockContext, exchange: Exchange[ListenRow], what: str
) -> Listener | None:
    """A connection woken by ``what`` (``exchange`` listens), unless only polling can
    work (``LockContext.wait_listen``, or a pooler found in between)."""
    if context.wait_listen is False:
        return None
    try:
        return await Listener.open(
            context.url,
            connection_kwargs(context.url, context.connect_timeout_seconds),
            WAKE_CHANNEL,
            exchange,
            detect=context.wait_listen is None,
        )
    except Exception as exc:
        logger.warning(
            "cannot listen for %s, polling instead: %s", what, scrub(str(exc), context.url)
        )
        return None
