"""Carrying out an acquisition's steps (``dislock.core.acquisition``) on a hub: each
statement sent and its answer (or error) fed back, each pause slept, the timeline
noted.

Every decision (the order of the statements, what an answer or a lost answer means) is
the sequence's.
"""

from __future__ import annotations

from datetime import datetime, timezone
from functools import partial
from time import monotonic
from typing import Any

from dislock.core.acquisition import Ask, Connect, Crowded, Given, Outcome, Pause, Steps
from dislock.core.context import LockContext
from dislock.core.unknown_outcome import HELD

from ._compat import sleep
from ._hub import Hub, enter_hub, leave_hub

GIVEN = Given(monotonic, partial(datetime.now, timezone.utc), HELD)
"""What the sequences read of the process: its clocks, and its rows."""


async def drive(hub: Hub, sequence: Steps[Outcome]) -> Outcome:
    """Run ``sequence`` on ``hub`` to its outcome (or the error it raises).  An
    interruption (a cancellation, ``KeyboardInterrupt``) closes the sequence at the
    step it was at, rather than leaving it suspended for the garbage collector."""
    reply: Any = None
    error: Exception | None = None
    try:
        while True:
            try:
                step = sequence.throw(error) if error is not None else sequence.send(reply)
            except StopIteration as done:
                outcome: Outcome = done.value
                return outcome
            reply, error = None, None
            if isinstance(step, Ask):
                try:
                    reply = await hub.ask(step.exchange, step.timeout, step.patience)
                except Exception as exc:  # the sequence decides what each error means
                    error = exc
            elif isinstance(step, Pause):
                await sleep(step.seconds)
            elif isinstance(step, Connect):
                await hub.connect(step.patience)
            elif isinstance(step, Crowded):
                reply = hub.crowded
            else:
                hub.note_timeline(step.timeline)
    finally:
        sequence.close()


async def drive_briefly(context: LockContext, sequence: Steps[Outcome]) -> Outcome:
    """Run ``sequence`` on the hub of ``context``'s database, used only meanwhile."""
    hub = enter_hub(context.url, context.connect_timeout_seconds)
    try:
        return await drive(hub, sequence)
    finally:
        await leave_hub(hub)
