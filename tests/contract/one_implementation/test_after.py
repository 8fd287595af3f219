"""``after=`` in Python: the sync decorator and the asyncio acquisition hold a slot
back until the key named succeeded in it (the CLI's: ``cli/test_after.py``)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

import dislock
import dislock.aio
from dislock import LockContext, LockNotAcquiredError

SCHEDULE = {"schedule": "0 0 1 1 *", "cron_tz": "UTC", "history": True}


def test_the_decorator_refuses_the_slot_until_the_key_succeeded_then_runs_once(
    make_context: Callable[..., LockContext], history: tuple[str, ...]
) -> None:
    export = make_context(lock_key="export", **SCHEDULE)
    context = make_context(lock_key="report", after=["export"], **SCHEDULE)
    runs: list[str] = []

    @dislock.with_locks(context, skip_held=False)
    def report() -> None:
        runs.append("report")

    with pytest.raises(LockNotAcquiredError, match="waits for 'export'"):
        report()
    with dislock.acquire_locks(export):
        pass
    report()
    with pytest.raises(LockNotAcquiredError, match="already started"):
        report()
    assert runs == ["report"]


@pytest.mark.asyncio
@pytest.mark.parametrize("listen", [None, False])
async def test_asyncio_waits_for_the_key_to_succeed(
    make_context: Callable[..., LockContext],
    history: tuple[str, ...],
    listen: bool | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="dislock")
    export = make_context(lock_key="export", **SCHEDULE)
    context = make_context(
        lock_key="report",
        after=["export"],
        wait_seconds=60,
        wait_poll_seconds=0.2,
        wait_listen=listen,
        **SCHEDULE,
    )
    exported = threading.Event()
    order: list[str] = []

    async def run_export() -> None:
        while "waiting up to 60 s" not in caplog.text:  # the report was refused first
            await asyncio.sleep(0.01)
        async with dislock.aio.acquire_locks(export):
            order.append("export")
        exported.set()

    async def run_report() -> Any:
        async with dislock.aio.acquire_locks(context):
            order.append("report" if exported.is_set() else "report before the export ended")

    await asyncio.wait_for(asyncio.gather(run_report(), run_export()), 60)
    assert order == ["export", "report"]
