# GENERATED from dislock-aio's dislock/aio/_waiting.py by tools/async_to_sync.py: do not edit.
# Change the asyncio source, then run `hatch run generate`.
"""Waiting for a lease held elsewhere: woken by its release (``LISTEN``), or by
polling where no notification can reach us.

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
from dislock.core.patience import ConnectPatience
from dislock.core.rows import lease_key
from dislock.core.waiting import WAKE_CHANNEL, WaitPlan, listen_query, wake_key

from ._compat import sleep
from ._listen import Listener

logger = logging.getLogger("dislock")

Taken = TypeVar("Taken", covariant=True)


class Attempt(Protocol[Taken]):
    """One try at the lease: what it took, or None while it is held elsewhere."""

    def __call__(self) -> Taken | None: ...


def wait_for_release(
    context: LockContext, attempt: Attempt[Taken], patience: ConnectPatience
) -> Taken | None:
    """Try again whenever the lease may have been released, until the wait is over:
    what ``attempt`` took, or None."""
    plan = WaitPlan(
        context.wait_seconds, started_at=monotonic(), poll_seconds=context.wait_poll_seconds
    )
    listener = _listen(context)
    logger.info(
        "lease %s is held; waiting up to %g s (%s)",
        lease_key(context.lock_key),
        context.wait_seconds,
        "woken by releases" if listener is not None else "polling",
    )
    waited_from: float | None = None
    try:
        while True:
            if waited_from is not None:
                # Waiting for the holder does not spend the patience with the database.
                patience.postpone(monotonic() - waited_from)
            # A release between the last try and the LISTEN would be missed:
            # so the LISTEN comes first, then the try.
            taken = attempt()
            if taken is not None:
                return taken
            delay = plan.next_delay(monotonic(), listening=listener is not None)
            if delay is None:
                return None
            waited_from = monotonic()
            if listener is None:
                sleep(delay)
                continue
            try:
                listener.wait(delay)
            except Exception as exc:
                logger.warning(
                    "stopped listening for releases, polling instead: %s",
                    scrub(str(exc), context.url),
                )
                listener.close()
                listener = None
    finally:
        if listener is not None:
            listener.close()


def _listen(context: LockContext) -> Listener | None:
    """A connection woken by releases of the lease, unless only polling can work."""
    if context.wait_listen is False:
        return None
    try:
        return Listener.open(
            context.url,
            connection_kwargs(context.url, context.connect_timeout_seconds),
            WAKE_CHANNEL,
            (listen_query(context.table_parts), {"wake_key": wake_key(context.lock_key)}),
            detect=context.wait_listen is None,
        )
    except Exception as exc:
        logger.warning(
            "cannot listen for releases, polling instead: %s", scrub(str(exc), context.url)
        )
        return None
