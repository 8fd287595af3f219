"""A wrapped run through the Python API, for a test to stop or block:
``python -m tests.support.stoppable FLAVOUR URL SCHEMA KEY TTL INTERVAL COMMAND...``.

FLAVOUR is ``sync`` or ``aio``: ``run_with_locks`` of that API runs COMMAND under a
lease on ``SCHEMA.key_value``, with the forwarded signals of the CLI, and logs to
stderr as the CLI does (one line per message, the locks' own notes on a loss left
out), so that a test can hold it to the CLI's one-line report.  The exit status is
``run_with_locks``'s.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from dislock import LockContext
from dislock.core.supervision import FORWARDED_SIGNALS, LOSS_LOGGER


def main(
    flavour: str, url: str, schema: str, key: str, ttl: str, interval: str, *command: str
) -> int:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("dislock: %(message)s"))
    handler.addFilter(lambda record: record.name != LOSS_LOGGER)
    logger = logging.getLogger("dislock")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    context = LockContext(
        url=url,
        table_parts=[schema, "key_value"],
        lock_key=key,
        owner=f"stoppable-{flavour}",
        run_ttl_seconds=float(ttl),
        lease_interval_seconds=float(interval),
    )
    if flavour == "sync":
        from dislock import run_with_locks

        return run_with_locks(
            command, context=context, strategies="lease", forward_signals=FORWARDED_SIGNALS
        )
    from dislock.aio import run_with_locks as run_with_locks_aio

    return asyncio.run(
        run_with_locks_aio(
            command, context=context, strategies="lease", forward_signals=FORWARDED_SIGNALS
        )
    )


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
