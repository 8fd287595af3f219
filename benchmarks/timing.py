"""Timing helpers every measure shares: medians, percentiles, timed and interleaved runs.

Interleaving is the point: on a noisy shared machine two commands timed one
after the other see different load, so each round runs every command once and
the medians over rounds are compared.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable

ROUNDS = 7
"""Interleaved rounds of a warm-cycle measure; its median is the result."""

Command = tuple[list[str], Callable[[], dict[str, str]]]
"""A command line and a maker of its environment (called anew for every run)."""


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def percentile_ms(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))] * 1000


def timed(command: list[str], env: dict[str, str], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        samples.append(time.perf_counter() - started)
    return samples


def interleaved(commands: dict[str, Command], repeat: int) -> dict[str, list[float]]:
    """Run each command once per round, rounds in turn, so drift hits all alike; every
    other round in the reverse order, so that none always runs after the same one."""
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for round_ in range(repeat):
        order = list(commands.items())
        for name, (command, env) in order[::-1] if round_ % 2 else order:
            samples[name] += timed(command, env(), 1)
    return samples
