"""The wrapper's start-up cost: a whole ``dislock URL true`` run against the floor.

The floor (``wrapper.FLOOR``) is what any run of a Python wrapper must pay: start
the interpreter, import psycopg, connect, one round trip.  It runs with the same
interpreter and psycopg as ours (the venv ours is installed in), interleaved with
ours and with ``dislock==0.1.0``, so that both ratios see the same load.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from benchmarks.installs import installed_dislock, old_dislock
from benchmarks.rows import Row, met
from benchmarks.timing import Command, interleaved, median_ms
from benchmarks.wrapper import FLOOR, floor_environment, wrapper_env


def cli_rows(url: str, repeat: int) -> list[Row]:
    rows = []
    with old_dislock() as old, installed_dislock() as (command, how):
        ours = [str(command)]
        # The floor runs in the same venv as ours, so both start the same interpreter
        # with the same psycopg.
        floor_cmd = [str(command.parent / "python"), "-c", FLOOR]
        for strategy in ("lease", "schedule"):
            fresh_env = partial(wrapper_env, url, strategy)
            floor_env: Callable[[], dict[str, str]] = partial(floor_environment, url)
            commands: dict[str, Command] = {
                "floor": (floor_cmd, floor_env),
                "ours": ([*ours, "DATABASE_URL", "true"], fresh_env),
            }
            if old is not None:
                commands["old"] = ([str(old), "DATABASE_URL", "true"], fresh_env)
            samples = interleaved(commands, repeat)
            floor, mine = median_ms(samples["floor"]), median_ms(samples["ours"])
            rows.append(
                Row(
                    f"CLI `dislock URL true`, {strategy}: ours ({how}) / floor",
                    "{ratio:.2f} ({ours_ms:.0f} ms / {floor_ms:.0f} ms)",
                    "≤ 1.05",
                    met(mine / floor <= 1.05),
                    {"ratio": mine / floor, "ours_ms": mine, "floor_ms": floor},
                    key=f"cli-floor:{strategy}",
                )
            )
            if "old" in samples:
                theirs = median_ms(samples["old"])
                rows.append(
                    Row(
                        f"CLI, {strategy}: ours / dislock 0.1.0",
                        "{ratio:.2f} (0.1.0: {old_floor_ratio:.2f} x floor)",
                        "≤ 0.95",
                        met(mine / theirs <= 0.95),
                        {"ratio": mine / theirs, "old_floor_ratio": theirs / floor},
                        key=f"cli-old:{strategy}",
                    )
                )
            else:
                rows.append(
                    Row(
                        f"CLI, {strategy}: ours / dislock 0.1.0",
                        "n/a",
                        "≤ 0.95",
                        "dislock 0.1.0 could not be installed",
                        key=f"cli-old:{strategy}",
                    )
                )
    return rows
