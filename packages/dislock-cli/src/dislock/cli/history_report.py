"""How ``dislockctl history`` and ``missed`` show what they read: tables of runs and
slots, outcomes in words, the summary line, and JSON."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from datetime import datetime, timezone
from typing import Any

from dislock.cli.missed_slots import Slot
from dislock.cli.run_history import Run


def format_time(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def describe_outcome(run: Run) -> str:
    if run.outcome == "killed" and run.signal is not None:
        import signal

        try:
            name = signal.Signals(run.signal).name
        except ValueError:
            name = f"signal {run.signal}"
        return f"killed ({name})"
    if run.outcome in ("failed", "lease_lost", "timed_out") and run.exit_code is not None:
        return f"{run.outcome.replace('_', ' ')} ({run.exit_code})"
    return run.outcome.replace("_", " ")


def render_runs(runs: Sequence[Run]) -> str:
    from dislock.cli.admin import format_duration
    from dislock.core.bounds import clip

    headers = ("STARTED (UTC)", "LOCK KEY", "HOST", "PID", "DURATION", "OUTCOME")
    lines = [
        (
            format_time(run.started_at),
            # Written by any machine (or by hand): escaped and clipped as `ls` does,
            # so that a terminal sequence in a host name is shown, never obeyed, and
            # a long one does not widen every line.
            clip(run.key),
            clip(run.host),
            str(run.pid),
            "-" if run.duration_seconds is None else format_duration(run.duration_seconds),
            clip(describe_outcome(run)),
        )
        for run in runs
    ]
    return _columns(headers, lines)


def describe_missed(
    key: str,
    schedule: str,
    zone: str,
    since: datetime,
    *,
    judged: int,
    missed: int,
    covered: int,
) -> str:
    """The summary line of ``dislockctl missed``."""
    line = (
        f"{missed} of {judged} slot(s) of {schedule!r} ({zone}) since {since:%Y-%m-%d %H:%M:%S}"
        f" UTC had no run of {key!r}"
    )
    if not missed:
        line += ": none missed"
    if covered:
        line += (
            f"; {covered} slot(s) were covered (no start, but a run of it was still going"
            " and held its lease)"
        )
    return line


def render_missed(slots: Sequence[Slot], late: Collection[datetime] = ()) -> str:
    """The missed slots, each ``missed`` (nobody started it) or ``late`` (nobody
    started it before its start deadline: ``late`` holds those slots' ends)."""
    headers = ("SLOT START (UTC)", "SLOT END (UTC)", "STATE")
    return _columns(
        headers,
        [
            (format_time(s.start), format_time(s.end), "late" if s.end in late else "missed")
            for s in slots
        ],
    )


def _columns(headers: Sequence[str], lines: Sequence[Sequence[str]]) -> str:
    widths = [max(len(cells[i]) for cells in (headers, *lines)) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        for cells in (headers, *lines)
    )


def dump(data: Any) -> str:
    return json.dumps(data, indent=2)
