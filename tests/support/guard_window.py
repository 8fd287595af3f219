"""A wrapped run whose wrapper is slow right after starting its command:
``python -m tests.support.guard_window FLAVOUR URL SCHEMA KEY WORKDIR``.

The command (``sleep 600`` in the background of ``sh``) writes the sleep's pid to
``WORKDIR/pid`` and touches ``WORKDIR/started``; the wrapper then takes 2 s before
its next step, as a wrapper descheduled right after starting its command on a
loaded machine would.  A test kills this process (SIGKILL) in that window: the
command's group must die with it all the same, though the guard was never told
the group (it finds the command by the run's token).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from dislock import LockContext


def main(flavour: str, url: str, schema: str, key: str, workdir: str) -> int:
    context = LockContext(
        url=url,
        table_parts=[schema, "key_value"],
        lock_key=key,
        owner="guard-window",
        run_ttl_seconds=30,
        lease_interval_seconds=1,
    )
    script = f'sleep 600 & echo $! > "{workdir}/pid"; touch "{workdir}/started"; wait'
    command = ["sh", "-c", script]
    if flavour == "sync":
        from dislock._sync import _supervisor as sync
        from dislock._sync._compat import Child

        real = Child.start

        def slow_start(*args: Any) -> Child:
            child = real(*args)
            time.sleep(2.0)
            return child

        Child.start = slow_start  # type: ignore[assignment]
        return sync.run_with_locks(command, context=context, strategies="lease")

    from dislock.aio import _supervisor as aio
    from dislock.aio._compat import Child as AioChild

    real_aio = AioChild.start

    async def slow_start_aio(*args: Any) -> AioChild:
        child = await real_aio(*args)
        time.sleep(2.0)  # the whole loop held up, as a descheduled process would be
        return child

    AioChild.start = slow_start_aio  # type: ignore[assignment]
    return asyncio.run(aio.run_with_locks(command, context=context, strategies="lease"))


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
