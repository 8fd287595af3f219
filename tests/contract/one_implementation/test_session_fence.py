"""A lock session's fencing token, read from the sync API's lock objects: the lease's,
whichever order the locks were taken in."""

from __future__ import annotations

from collections.abc import Callable

import dislock
from dislock import LockContext

MakeContext = Callable[..., LockContext]


def test_session_token_is_the_lease_s_in_any_order(
    make_context: MakeContext, fenced: tuple[str, str]
) -> None:
    context = make_context(
        schedule="0 0 1 1 *", fencing=True, run_ttl_seconds=5.0, lease_interval_seconds=1.0
    )
    lease, slot = dislock.LeaseLock(context), dislock.ScheduleLock(context)
    with lease:
        pass  # the lease's counter moves ahead of the slot's
    with slot, lease:
        assert lease.fence is not None and slot.fence is not None and lease.fence != slot.fence
        for locks in ((slot, lease), (lease, slot)):
            assert dislock.LockSession(locks).fencing_token == lease.fence
        assert dislock.LockSession((slot,)).fencing_token == slot.fence
