"""The wrapper's start-up cost: a whole ``dislock URL true`` run against the floor.

The floor (``wrapper.FLOOR``) is what any run of a Python wrapper must pay: start
the interpreter, import psycopg, connect, one round trip.  It runs with the same
interpreter and psycopg as ours (the venv ours is installed in), interleaved with
ours and with ``dislock==0.1.0`` (and, with ``--against REV``, an older revision of
this repository built the same way), so that every ratio sees the same load.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path

from benchmarks.installs import installed_dislock, old_dislock, revision
from benchmarks.rows import Row, met
from benchmarks.timing import Command, interleaved, median_ms
from benchmarks.wrapper import FLOOR, floor_environment, wrapper_env

OLD_AIM = 0.85
"""ours / dislock 0.1.0: the aim of the issue "The server plans once" (#49)."""


@contextmanager
def against_revision(rev: str | None) -> Iterator[Path | None]:
    """The ``dislock`` command of revision ``rev`` installed from its wheels, or None."""
    if rev is None:
        yield None
        return
    with revision(rev) as checkout, installed_dislock(checkout) as (command, how):
        yield command if how == "installed from wheels" else None


def cli_rows(url: str, repeat: int, against: str | None = None) -> list[Row]:
    rows = []
    with ExitStack() as stack:
        old = stack.enter_context(old_dislock())
        command, how = stack.enter_context(installed_dislock())
        theirs = stack.enter_context(against_revision(against))
        # The floor runs in the same venv as ours, so both start the same interpreter
        # with the same psycopg.
        floor_cmd = [str(command.parent / "python"), "-c", FLOOR]
        for strategy in ("lease", "schedule"):
            fresh_env = partial(wrapper_env, url, strategy)
            floor_env: Callable[[], dict[str, str]] = partial(floor_environment, url)
            commands: dict[str, Command] = {
                "floor": (floor_cmd, floor_env),
                "ours": ([str(command), "DATABASE_URL", "true"], fresh_env),
            }
            if old is not None:
                commands["old"] = ([str(old), "DATABASE_URL", "true"], fresh_env)
            if theirs is not None:
                commands["rev"] = ([str(theirs), "DATABASE_URL", "true"], fresh_env)
            samples = interleaved(commands, repeat)
            rows += strategy_rows(strategy, how, samples, against)
    return rows


def strategy_rows(
    strategy: str, how: str, samples: dict[str, list[float]], against: str | None
) -> list[Row]:
    floor, mine = median_ms(samples["floor"]), median_ms(samples["ours"])
    rows = [
        Row(
            f"CLI `dislock URL true`, {strategy}: ours ({how}) / floor",
            "{ratio:.2f} ({ours_ms:.0f} ms / {floor_ms:.0f} ms)",
            "≤ 1.05",
            met(mine / floor <= 1.05),
            {"ratio": mine / floor, "ours_ms": mine, "floor_ms": floor},
            key=f"cli-floor:{strategy}",
        )
    ]
    if "old" in samples:
        theirs = median_ms(samples["old"])
        rows.append(
            Row(
                f"CLI, {strategy}: ours / dislock 0.1.0 (the floor / 0.1.0: the least it can be)",
                "{ratio:.2f} (floor: {floor_ratio:.2f})",
                f"≤ {OLD_AIM}",
                met(mine / theirs <= OLD_AIM),
                {
                    "ratio": mine / theirs,
                    "floor_ratio": floor / theirs,
                    "old_floor_ratio": theirs / floor,  # the plot's bar of 0.1.0
                },
                key=f"cli-old:{strategy}",
            )
        )
    else:
        rows.append(
            Row(
                f"CLI, {strategy}: ours / dislock 0.1.0",
                "n/a",
                f"≤ {OLD_AIM}",
                "dislock 0.1.0 could not be installed",
                key=f"cli-old:{strategy}",
            )
        )
    if against is not None:
        result = "n/a (its wheels did not build or install)"
        numbers: dict[str, float | str] = {}
        if "rev" in samples:
            result, numbers = (
                "{ratio:.3f} ({ours_ms:.1f} ms / {rev_ms:.1f} ms)",
                {
                    "ratio": mine / median_ms(samples["rev"]),
                    "ours_ms": mine,
                    "rev_ms": median_ms(samples["rev"]),
                },
            )
        rows.append(Row(f"  same, ours / revision {against}", result, "report", "", numbers))
    return rows
