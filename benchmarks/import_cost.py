"""What importing dislock adds to a process that has psycopg already.

Measured inside fresh interpreters, from just after ``import psycopg`` to just
after ``import dislock`` (a difference of two whole process timings would be all
noise): psycopg is the floor, since no wrapper or user of dislock goes without it.
"""

from __future__ import annotations

import subprocess
import sys

from benchmarks.rows import Row, met
from benchmarks.timing import median_ms

IMPORT_COST = (
    "import time; import psycopg; started = time.perf_counter(); import {module};"
    " print(time.perf_counter() - started)"
)


def import_rows(repeat: int) -> list[Row]:
    rows = []
    for module in ("dislock", "dislock.cli"):
        code = IMPORT_COST.format(module=module)
        samples = [
            float(
                subprocess.run(
                    [sys.executable, "-c", code], capture_output=True, text=True, check=True
                ).stdout
            )
            for _ in range(repeat)
        ]
        extra = median_ms(samples)
        rows.append(
            Row(
                f"`import {module}` beyond `import psycopg`",
                "{extra_ms:.1f} ms",
                "≤ 15 ms",
                met(extra <= 15),
                {"extra_ms": extra},
            )
        )
    return rows
