"""What a lease renewal costs in CPU on the wrapper's machine: the wrapper's renewal
and the deadline it pushes to its guard (the process outside the command's group
that kills the group once the lease's local deadline passes without news).

Two lease runs of ``dislock URL sleep S`` side by side: one renewing every
``FAST`` seconds, one that never renews within ``S`` (its heartbeat is longer).
The CPU of each whole run (the wrapper, its guard and the command, from the
wrapper's ``wait4`` usage, which counts the children it reaped) differs by the
renewals alone, so the difference over the number of renewals (counted from the
wrapper's debug log) is the cost of one, with the interpreter's start and the
connection taken out.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile

from benchmarks.rows import Row, met
from benchmarks.wrapper import editable_dislock, wrapper_env

FAST = 0.05
"""Seconds between renewals in the renewing run."""

ROUNDS = 3


def _run(url: str, seconds: float, interval: float) -> tuple[float, int]:
    """The CPU seconds of one lease run of ``sleep seconds`` (wrapper, guard and
    command), and how many renewals it sent."""
    env = {
        **wrapper_env(url, "lease"),
        "LOCK_LEASE_INTERVAL": str(interval),
        "CRONJOB_LOCK_LOG_LEVEL": "DEBUG",
    }
    with tempfile.TemporaryFile(mode="w+") as log:
        process = subprocess.Popen(
            [editable_dislock(), "DATABASE_URL", "sleep", str(seconds)], env=env, stderr=log
        )
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        text = log.read()
    if process.returncode != 0:
        raise RuntimeError(f"the lease run failed ({process.returncode}): {text[-500:]}")
    renewals = sum(" renewed " in line for line in text.splitlines())
    return usage.ru_utime + usage.ru_stime, renewals


def renewal_cpu_rows(url: str, seconds: float) -> list[Row]:
    costs, counted = [], []
    for _ in range(ROUNDS):
        busy_cpu, busy_renewals = _run(url, seconds, FAST)
        idle_cpu, idle_renewals = _run(url, seconds, 4 * seconds)
        renewals = busy_renewals - idle_renewals
        if renewals <= 0:
            raise RuntimeError("the renewing run renewed no more often than the other")
        costs.append((busy_cpu - idle_cpu) / renewals)
        counted.append(busy_renewals)
    per_renewal_ms = statistics.median(costs) * 1000
    return [
        Row(
            f"lease renewal on the wrapper's machine: CPU per renewal (wrapper + its guard;"
            f" a run renewing every {FAST * 1000:.0f} ms for {seconds:g} s against one that"
            " does not renew)",
            "{per_renewal_ms:.2f} ms ({renewals} renewals a run)",
            "≤ 1 ms",
            met(per_renewal_ms <= 1.0),
            {"per_renewal_ms": per_renewal_ms, "renewals": int(statistics.median(counted))},
        )
    ]
