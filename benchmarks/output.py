"""The output of a wrapped command: its throughput through the wrapper when the end of
a failed run's output is kept (``LOCK_OUTPUT_TAIL_BYTES``), against the command
writing to the wrapper's streams itself.

The wrapper's stdout is a pipe this process drains, as a cron daemon's or a shell
pipeline's would be; the command writes ``megabytes`` MiB of zeros (``head -c``)
and exits 1, so that the tail is kept and stored.  Interleaved rounds, medians.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time

import psycopg

from benchmarks.rows import Row, met
from benchmarks.wrapper import editable_dislock, wrapper_env

ROUNDS = 5


def _drained(command: list[str], env: dict[str, str]) -> float:
    """Seconds from start to exit, the whole of stdout read as it comes."""
    started = time.perf_counter()
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE) as process:
        assert process.stdout is not None
        source = process.stdout.fileno()
        while os.read(source, 1 << 20):
            pass
        process.wait()
    return time.perf_counter() - started


def output_rows(url: str, megabytes: int) -> list[Row]:
    from dislock.core.history import create_history

    with psycopg.connect(url, autocommit=True) as conn:
        for statement in create_history(("key_value_history",)):
            conn.execute(statement)
    script = f"head -c {megabytes * 1024 * 1024} /dev/zero; exit 1"
    command = [editable_dislock(), "DATABASE_URL", "sh", "-c", script]
    times: dict[str, list[float]] = {"inherited": [], "tail": []}
    for _ in range(ROUNDS):
        for name, limit in (("inherited", "0"), ("tail", "4096")):
            env = {
                **wrapper_env(url, "lease"),
                "LOCK_HISTORY": "1",
                "LOCK_OUTPUT_TAIL_BYTES": limit,
            }
            times[name].append(_drained(command, env))
    inherited, tail = (statistics.median(times[name]) for name in ("inherited", "tail"))
    # What the copying adds, per MiB: the whole runs' start-up and release cancel out.
    per_mib_ms = max(0.0, tail - inherited) * 1000 / megabytes
    return [
        Row(
            f"a failed command's {megabytes} MiB of output through the wrapper, its end kept"
            " (LOCK_OUTPUT_TAIL_BYTES=4096) / written by the command itself (whole runs,"
            " drained through a pipe); and what the copying adds per MiB",
            "{ratio:.2f} (+{per_mib_ms:.2f} ms per MiB)",
            "≤ 5 ms per MiB (≥ 200 MiB/s)",
            met(per_mib_ms <= 5),
            {"ratio": tail / inherited, "per_mib_ms": per_mib_ms},
            key="output_tail",
        )
    ]
