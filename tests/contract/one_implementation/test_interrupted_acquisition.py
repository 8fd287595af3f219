"""An acquisition interrupted after its statement took the row hands the row back.

The interruption is made to come at the worst moment, between the acquiring
statement's answer and the lease's registration with the renewer (the bookkeeping
both flavours share, ``dislock.core.lease_state``, is made to fail there): a Ctrl-C or a
signal (sync), a cancellation (asyncio).  The row must not be left held until its
TTL runs out, with nobody renewing it and nobody running the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from dislock import LeaseLock, LockContext
from dislock.aio import LeaseLock as AioLeaseLock
from dislock.core import lease_state
from dislock.core.rows import lease_key
from tests.support.rows import Rows, released_owner

MakeContext = Callable[..., LockContext]


def interrupting_renewal(raised: BaseException) -> Callable[..., Any]:
    def renewal(**fields: Any) -> Any:
        raise raised

    return renewal


@pytest.mark.parametrize("slots", [1, 3])
def test_sync_interrupted_after_taking_the_row_hands_it_back(
    make_context: MakeContext, rows: Rows, monkeypatch: pytest.MonkeyPatch, slots: int
) -> None:
    context = make_context(run_ttl_seconds=60.0, lease_interval_seconds=5.0, slots=slots)
    monkeypatch.setattr(lease_state, "Renewal", interrupting_renewal(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        LeaseLock(context).__enter__()
    row = rows.get(lease_key(context.lock_key))  # slot 1 is the plain lease row
    assert row is not None and row.expired, row
    assert released_owner(row.value) == context.owner
    monkeypatch.undo()
    with LeaseLock(context):  # and the lease can be taken at once
        pass


@pytest.mark.asyncio
async def test_aio_cancelled_after_taking_the_row_hands_it_back(
    make_context: MakeContext, rows: Rows, monkeypatch: pytest.MonkeyPatch
) -> None:
    context = make_context(run_ttl_seconds=60.0, lease_interval_seconds=5.0)
    monkeypatch.setattr(lease_state, "Renewal", interrupting_renewal(asyncio.CancelledError()))
    with pytest.raises(asyncio.CancelledError):
        await AioLeaseLock(context).__aenter__()
    row = rows.get(lease_key(context.lock_key))
    assert row is not None and row.expired, row
    assert released_owner(row.value) == context.owner
