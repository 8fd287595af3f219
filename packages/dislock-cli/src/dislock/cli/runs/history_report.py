"""How ``dislockctl history`` and ``missed`` show what they read: tables of runs and
slots, outcomes in words, the summary line."""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone

from dislock.cli.admin import aligned, format_duration
from dislock.cli.far_times import far
from dislock.cli.runs.envelope import FACTOR, NOT_RUNS, WINDOW
from dislock.cli.runs.missed_slots import COVERED, PAUSED, STATES, TO_LOOK_AT, SlotState
from dislock.cli.runs.run_history import Run
from dislock.core.after import HELD_BACK
from dislock.core.bounds import clip, escape
from dislock.core.operator_commands import OUTCOMES as EVENTS
from dislock.core.pause import describe_until


def format_time(value: datetime | None) -> str:
    if value is None:
        return "-"
    return far(value) or value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def describe_outcome(run: Run) -> str:
    if run.outcome == "paused":
        return f"paused {describe_until(run.slot_end)}"
    if run.outcome == "killed" and run.signal is not None:
        try:
            name = signal.Signals(run.signal).name
        except ValueError:
            name = f"signal {run.signal}"
        return f"killed ({name})"
    if run.outcome in ("failed", "lease_lost", "timed_out") and run.exit_code is not None:
        return f"{run.outcome.replace('_', ' ')} ({run.exit_code})"
    return run.outcome.replace("_", " ")


def attempts(runs: Sequence[Run]) -> dict[int, int]:
    """Which attempt at its slot each run of ``runs`` was (by run id), counted in the
    order they started among the runs that claimed the same slot of the same key; a
    rerun of the key starts the count again, as it does for the wrappers.  Runs
    without a claimed slot (a lease alone), late marks and events have none."""
    counted: dict[tuple[str, object], int] = {}
    found: dict[int, int] = {}
    for run in sorted(runs, key=lambda run: run.started_at):
        if run.outcome == "rerun":
            counted = {slot: n for slot, n in counted.items() if slot[0] != run.key}
        elif run.slot_end is not None and run.outcome not in NOT_RUNS:
            slot = (run.key, run.slot_end)
            counted[slot] = found[run.id] = counted.get(slot, 0) + 1
    return found


def render_runs(runs: Sequence[Run], marks: Mapping[int, str | None] | None = None) -> str:
    """The runs as a table; ``marks``: each run's against its key's envelope
    (``dislock.cli.runs.envelope``), explained under the table when any is marked."""
    numbers = attempts(runs)
    # Every attempt of a slot that had more than one is numbered, its first too.
    retried = {(run.key, run.slot_end) for run in runs if numbers.get(run.id, 1) > 1}
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
            # An operator's event (a pause, a rerun) takes no time of the job's.
            "-"
            if run.duration_seconds is None or run.outcome in EVENTS
            else format_duration(run.duration_seconds),
            clip(describe_outcome(run))
            + (
                f", attempt {numbers[run.id]}"
                if run.id in numbers and (run.key, run.slot_end) in retried
                else ""
            )
            + (f", {marks[run.id]}" if marks and marks.get(run.id) else ""),
        )
        for run in runs
    ]
    if not marks or not any(marks.values()):
        return aligned([headers, *lines])
    return (
        f"{aligned([headers, *lines])}\n\nslow: longer than {FACTOR:g} x the median and the"
        f" longest of its key's last {WINDOW} successful runs before it; short: under"
        f" 1/{FACTOR:g} of that median"
    )


TAIL_LINES = 20
"""Lines of each stream's tail ``history`` shows under its table (``--json``: all)."""


TAIL_LINE_CHARS = 400
"""The longest line of a kept stream shown in full; a longer one shows its end,
where a failure usually says what happened (``--json`` has all of it)."""


def shown_tail(text: str) -> tuple[list[str], bool]:
    """A kept stream's last ``TAIL_LINES`` lines as shown, each with every control
    character escaped and at most ``TAIL_LINE_CHARS`` long, and whether earlier lines
    were left out."""
    lines = text.splitlines()
    shown = [
        line if len(line) <= TAIL_LINE_CHARS else f"…{line[-(TAIL_LINE_CHARS - 1) :]}"
        for line in lines[-TAIL_LINES:]
    ]
    return [escape(line) for line in shown], len(lines) > TAIL_LINES


def render_tails(runs: Sequence[Run]) -> str:
    """The end of each listed run's output that was kept (a failed run's, with
    ``LOCK_OUTPUT_TAIL_BYTES``), its last ``TAIL_LINES`` lines per stream, every
    control character but the line breaks escaped; empty when none was kept."""
    blocks = []
    for run in runs:
        streams = [
            (n, t) for n, t in (("stdout", run.stdout_tail), ("stderr", run.stderr_tail)) if t
        ]
        if not streams:
            continue
        block = [
            f"output of run {run.id} ({clip(run.key)} on {clip(run.host)},"
            f" {clip(describe_outcome(run))}, started {format_time(run.started_at)} UTC):"
        ]
        for name, text in streams:
            lines, cut = shown_tail(text)
            block.append(f"  {name}{f', last {TAIL_LINES} lines' if cut else ''}:")
            block += [f"    {line}" for line in lines]
        blocks.append("\n".join(block))
    return "\n\n".join(blocks)


def describe_missed(
    key: str, schedule: str, zone: str, since: datetime, counts: Mapping[str, int]
) -> str:
    """The summary line of ``dislockctl missed``: how many slots are to look at
    (``dislock.cli.runs.missed_slots.TO_LOOK_AT``), then how many are in each other state."""
    judged = sum(counts.values())
    wrong = sum(counts.get(state, 0) for state in TO_LOOK_AT)
    line = (
        f"{wrong} of {judged} slot(s) of {schedule!r} ({zone}) since {since:%Y-%m-%d %H:%M:%S}"
        f" UTC were missed, late or failed for {key!r}"
    )
    if wrong:
        line += " (" + _counted(counts, TO_LOOK_AT) + ")"
    rest = [state for state in STATES if state not in TO_LOOK_AT]
    if any(counts.get(state, 0) for state in rest):
        line += "; " + _counted(counts, rest)
    if counts.get(PAUSED):
        line += "; paused: a dislockctl pause was in force as the slot began"
    if counts.get(HELD_BACK):
        line += "; held back: refused while a key of its LOCK_AFTER had not succeeded in it"
    if counts.get(COVERED):
        line += "; covered: no start, but a run of it was still going and held its lease"
    return line


def _counted(counts: Mapping[str, int], states: Sequence[str]) -> str:
    return ", ".join(
        f"{counts[state]} {state.replace('_', ' ')}" for state in states if counts.get(state, 0)
    )


def render_slots(states: Sequence[SlotState]) -> str:
    """Slots and what became of them (``dislock.cli.runs.missed_slots``), with the
    number of attempts each had."""
    lines = [
        (format_time(s.slot.start), format_time(s.slot.end), s.described(), str(s.attempts))
        for s in states
    ]
    return aligned([("SLOT START (UTC)", "SLOT END (UTC)", "STATE", "ATTEMPTS"), *lines])
