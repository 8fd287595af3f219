# GENERATED from dislock-aio's dislock/aio/_after.py by tools/async_to_sync.py: do not edit.
# Change the asyncio source, then run `hatch run generate`.
"""Waiting for the keys a schedule slot comes after (``LockContext.after`` with
``wait_seconds``): woken by their successes (``LISTEN``), or by polling where no
notification can reach us.

Hand-written in ``dislock/aio/_after.py``; ``dislock/_sync/_after.py`` is
generated from it by ``tools/async_to_sync.py``.  What a slot waits for, and the
wake-up a success sends, are ``dislock.core.after``'s; how long to wait and how
often to poll, ``dislock.core.waiting``'s.
"""

from __future__ import annotations

import logging
from time import monotonic
from typing import Protocol, TypeVar

from dislock.core.after import DependencyPending, listen_after
from dislock.core.context import LockContext
from dislock.core.dsn import scrub
from dislock.core.history import history_table
from dislock.core.patience import ConnectPatience
from dislock.core.waiting import WaitPlan

from ._compat import sleep
from ._listen import Listener
from ._waiting import listening

logger = logging.getLogger("dislock")

Taken = TypeVar("Taken", covariant=True)


class Claim(Protocol[Taken]):
    """The slot's claim, raising ``DependencyPending`` while a key has not succeeded."""

    def __call__(self) -> Taken: ...


def wait_after(context: LockContext, claim: Claim[Taken], patience: ConnectPatience) -> Taken:
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
                return claim()
            except DependencyPending as pending:
                if pending.key != listened:
                    # A success between the check and the LISTEN would be missed: so
                    # the LISTEN comes first, then the check again.
                    if waited_from is None:
                        logger.info("%s; waiting up to %g s", pending, context.wait_seconds)
                    if listener is not None:
                        listener.close()
                    listen_to = listen_after(table, pending.key)
                    listener, listened = (
                        listening(context, listen_to, "successes"),
                        pending.key,
                    )
                    waited_from = monotonic()
                    continue
                delay = plan.next_delay(monotonic(), listening=listener is not None)
                if delay is None:
                    raise
            waited_from = monotonic()
            if listener is None:
                sleep(delay)
                continue
            try:
                listener.wait(delay)
            except Exception as exc:
                logger.warning(
                    "stopped listening for successes, polling instead: %s",
                    scrub(str(exc), context.url),
                )
                listener.close()
                listener = None
    finally:
        if listener is not None:
            listener.close()
