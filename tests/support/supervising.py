"""Supervising a command while its lease is taken away, in either flavour of the API."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

import pytest

import dislock
import dislock.aio
from dislock import LeaseLossPolicy, LeaseLostError, LockContext
from dislock._sync._supervisor import supervise as sync_supervise
from dislock.aio._session import acquire_unguarded
from dislock.aio._supervisor import supervise as aio_supervise


def supervise_losing_the_lease(
    flavour: str, context: LockContext, argv: Sequence[str], steal: Callable[[], None]
) -> int:
    """Take ``context``'s lease with the ``flavour`` API ("sync" or "aio"), supervise
    ``argv`` under it (``TERMINATE``) while ``steal`` runs in a thread of its own,
    and return the supervisor's exit status.  Leaving the session must raise
    ``LeaseLostError``: ``steal`` is expected to take the row away."""
    codes: list[int] = []
    policy = LeaseLossPolicy.TERMINATE
    if flavour == "sync":
        thief = threading.Thread(target=steal)

        def run() -> None:
            with dislock.acquire_locks(context, ["lease"]) as session:
                thief.start()
                codes.append(sync_supervise(argv, session, policy))

        with pytest.raises(LeaseLostError):
            run()
        thief.join()
    else:

        async def main() -> None:
            # As run_with_locks does: the supervisor stops its command itself, so the
            # task running it is not cancelled on the loss (acquire_locks would).
            async with acquire_unguarded(context, ["lease"]) as session:
                supervised = asyncio.ensure_future(aio_supervise(argv, session, policy))
                await asyncio.to_thread(steal)
                codes.append(await supervised)

        with pytest.raises(LeaseLostError):
            asyncio.run(main())
    assert len(codes) == 1
    return codes[0]
