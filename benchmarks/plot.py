"""docs/benchmarks.png: a CLI run's wall time relative to the floor, ours and 0.1.0's.

The bars are the ratios the CLI measure took (``cli.cli_rows``), found by the
rows' keys and read from their numbers, never from the table's text.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.rows import Row

OURS, OLD = "#4a7ab5", "#a0a0a0"


def bars(rows: list[Row]) -> list[tuple[str, float, str]]:
    """Label, ratio to the floor and colour of each bar, in the rows' order."""
    found = []
    for row in rows:
        kind, _, strategy = row.key.partition(":")
        if kind == "cli-floor":
            found.append((f"ours, {strategy}", float(row.numbers["ratio"]), OURS))
        elif kind == "cli-old" and "old_floor_ratio" in row.numbers:
            found.append((f"dislock 0.1.0, {strategy}", float(row.numbers["old_floor_ratio"]), OLD))
    return found


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = bars(rows)
    figure, axis = plt.subplots(figsize=(7, 2.8))
    axis.barh([b[0] for b in shown], [b[1] for b in shown], color=[b[2] for b in shown])
    axis.invert_yaxis()
    axis.axvline(1.0, color="black", linewidth=0.8)
    axis.axvline(1.05, color="#b54a4a", linestyle="--", linewidth=0.8, label="target 1.05")
    axis.set_xlim(0, max([1.2] + [b[1] * 1.08 for b in shown]))
    axis.set_xlabel("median wall time / floor (python + psycopg + one connection)")
    axis.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
