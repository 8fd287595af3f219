"""The suite's polling helper: it answers the predicate's value, or fails in time."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.eventually import eventually, eventually_async


def test_eventually_returns_the_first_truthy_answer() -> None:
    answers = iter([None, 0, "", "found", "later"])
    assert eventually(lambda: next(answers), interval=0) == "found"


def test_eventually_fails_with_its_message_once_the_timeout_is_over() -> None:
    asked: list[float] = []
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"never came \(within 0.2 s\)"):
        eventually(lambda: asked.append(time.monotonic()), timeout=0.2, message="never came")
    assert time.monotonic() - started >= 0.2
    assert len(asked) >= 2  # it asked again before giving up


def test_eventually_builds_a_message_from_a_function_at_the_end() -> None:
    seen = [0]

    def ask() -> bool:
        seen[0] += 1
        return False

    with pytest.raises(AssertionError, match=r"asked \d+ times"):
        eventually(ask, timeout=0.05, message=lambda: f"asked {seen[0]} times")


def test_eventually_async_lets_the_loop_run_between_questions() -> None:
    async def scenario() -> int:
        ticks = [0]

        async def tick() -> None:
            while True:
                ticks[0] += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(tick())
        try:
            return await eventually_async(lambda: ticks[0] >= 3 and ticks[0], interval=0)
        finally:
            ticker.cancel()

    assert asyncio.run(scenario()) >= 3
    with pytest.raises(AssertionError, match="nothing"):
        asyncio.run(eventually_async(lambda: None, timeout=0.05, message="nothing"))
