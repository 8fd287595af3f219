"""``dislockctl missed``: what became of each slot of LOCK_KEY's schedule, judged
from the recorded runs and an operator's events (``dislock.cli.runs.missed_slots``): the
slots missed, late or failed are listed (exit 1 if any), ``--all`` lists every one."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from dislock.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from dislock.cli.commands._call import Call, error, unknown_key, warn_disagreements
from dislock.cli.sending import send

if TYPE_CHECKING:
    from datetime import datetime, tzinfo

    from dislock.cli.runs.missed_slots import SlotState
    from dislock.cli.sending import Connection
    from dislock.core.cron_zone import CronZone


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lock_key", metavar="LOCK_KEY")
    parser.add_argument(
        "--schedule", help="cron expression (default: the one recorded with its runs)"
    )
    parser.add_argument(
        "--tz",
        help="time zone of the schedule (default: the one recorded with its runs, else "
        "$CRON_TZ or the local zone, as the wrapper reads it)",
    )
    parser.add_argument("--since", default="24h", help="how far back (default 24h)")
    parser.add_argument(
        "--grace", default="1m", help="do not judge a slot younger than this (default 1m)"
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="list every slot, done, running, paused and covered ones too",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")


class _Asked(NamedTuple):
    since: timedelta
    grace: timedelta
    schedule: str | None
    zone: Any
    """The CronZone of ``--tz`` (None: the one recorded with the runs, else CRON_TZ/local)."""


def run(call: Call) -> int:
    """Bad durations, cron expressions and zones are refused before connecting."""
    from dislock.cli.time_args import parse_duration
    from dislock.core.cron import check_cron
    from dislock.core.cron_zone import load_zone

    args = call.args
    history = call.history_table()
    schedule = None if args.schedule is None else check_cron(args.schedule, name="--schedule")
    zone = None if args.tz is None else load_zone(args.tz, name="--tz")
    since = parse_duration(args.since, name="--since")
    no_grace = args.grace.strip() in ("0", "0s")
    grace = timedelta(0) if no_grace else parse_duration(args.grace, name="--grace")
    asked = _Asked(since, grace, schedule, zone)
    return call.on_history(history, lambda conn: _missed(conn, call, history, asked))


def _missed(conn: Connection, call: Call, history: tuple[str, ...], asked: _Asked) -> int:
    import json

    from dislock.cli.admin import DATABASE_NOW
    from dislock.cli.runs.history_report import describe_missed, render_slots
    from dislock.cli.runs.missed_slots import COVERED, TO_LOOK_AT, count

    table, key = call.table, call.args.lock_key
    found = _schedule_and_zone(conn, table, history, asked, key)
    if isinstance(found, int):
        return found
    schedule, zone = found
    now = send(conn, DATABASE_NOW)
    since = now - asked.since
    judged = _judge(conn, table, history, key, schedule, zone.tz, since, now, asked.grace)
    if isinstance(judged, int):
        return judged
    slots, runs, states = judged
    to_look_at = [found for found in states if found.state in TO_LOOK_AT]
    readings = warn_disagreements(conn, history, asked.since, key)
    counts = count(states)
    if call.args.json:
        report = {
            "key": key,
            "schedule": schedule,
            "tz": zone.name,
            "since": since.isoformat(),
            "until": now.isoformat(),
            "slots": slots,
            "runs": runs,
            "missed": [found.as_json() for found in to_look_at],
            "covered": [found.slot.as_json() for found in states if found.state == COVERED],
            "counts": counts,
            "states": [found.as_json() for found in states],
            "readings": [reading._asdict() for reading in readings],
        }
        print(json.dumps(report, indent=2))
    else:
        listed = states if call.args.all else to_look_at
        if listed:
            print(render_slots(listed))
        print(describe_missed(key, schedule, zone.name, since, counts))
    return EXIT_FAILURE if to_look_at else EXIT_OK


def _schedule_and_zone(
    conn: Connection, table: tuple[str, ...], history: tuple[str, ...], asked: _Asked, key: str
) -> tuple[str, CronZone] | int:
    """The schedule and zone to judge in: as asked, else as recorded with the runs,
    else the zone the wrapper on this machine would read; or the exit status."""
    from dislock.cli.runs.run_history import recorded_schedule
    from dislock.core.cron_zone import cron_zone, load_zone, recorded_zone
    from dislock.core.errors import ConfigurationError

    schedule, zone = asked.schedule, asked.zone
    if schedule is None:
        recorded = send(conn, recorded_schedule(history, key))
        if recorded is None:
            if unknown_key(conn, table, history, key):
                return EXIT_FAILURE
            return error(f"no run of {key!r} recorded a schedule: pass --schedule CRON", EXIT_USAGE)
        schedule = recorded.cron
        if zone is None and recorded.cron_tz is not None:
            try:
                # Any machine writing the history chose this text: an IANA name only,
                # never a path (a FIFO there would hang this command), as serve reads it.
                recorded_zone(recorded.cron_tz)
                zone = load_zone(recorded.cron_tz, name="the recorded cron_tz")
            except ConfigurationError as exc:
                return error(f"{exc}; pass --tz", EXIT_USAGE)
    try:
        return schedule, zone or cron_zone()  # as the wrapper on this machine would read it
    except ConfigurationError as exc:
        return error(str(exc), EXIT_USAGE)


def _judge(
    conn: Connection,
    table: tuple[str, ...],
    history: tuple[str, ...],
    key: str,
    schedule: str,
    tz: tzinfo,
    since: datetime,
    now: datetime,
    grace: timedelta,
) -> tuple[int, int, list[SlotState]] | int:
    """How many slots and runs, and each slot's state; or the exit status."""
    from dislock.cli.runs import missed_slots
    from dislock.cli.runs.envelope import NOT_RUNS
    from dislock.cli.runs.missed_slots import LATE, Attempt, slot_states
    from dislock.core.after import HELD_BACK, waited_for
    from dislock.core.errors import ConfigurationError
    from dislock.core.operator_commands import pause_spans, pauses, reruns
    from dislock.core.retries import waiting

    rows = send(conn, missed_slots.starts(history, table, key, since))
    # A slot marked late (past its start deadline, nobody started it) has a row but no
    # start; so has one held back by a key of its LOCK_AFTER; neither has an operator's
    # event (a rerun, a pause).
    marks = [
        (row.started_at, row.slot_end)
        for row in rows
        if row.outcome in (LATE, HELD_BACK) and row.started_at is not None
    ]
    attempts = [
        Attempt(row.started_at, row.slot_end, row.outcome, bool(row.running))
        for row in rows
        if row.started_at is not None and row.outcome not in NOT_RUNS
    ]
    try:
        slots = list(missed_slots.schedule_slots(schedule, since, now, grace, tz))
    except ConfigurationError as exc:
        return error(str(exc), EXIT_USAGE)
    if not rows[0].ran_before:
        # A job new within the window did not miss the slots before it existed.
        starts = [(attempt.started_at, attempt.slot_end) for attempt in attempts]
        slots = missed_slots.from_first_run(slots, starts + marks)
    held_back: dict[datetime, str] = {}
    for row in rows:  # the key each slot held back waited for (the first row's, if two)
        if row.outcome == HELD_BACK and row.slot_end is not None:
            held_back.setdefault(row.slot_end, waited_for(row.waiting_for) or "?")
    events = send(conn, pauses(history, key, since))
    spans = send(conn, missed_slots.spans(history, table, key, since))
    states = slot_states(
        slots,
        attempts,
        now=now,
        late={row.slot_end for row in rows if row.outcome == LATE and row.slot_end is not None},
        pauses=pause_spans(events),
        spans=spans,
        retrying=send(conn, waiting(table, key)),
        reruns=reruns(events),
        held_back=held_back,
    )
    return len(slots), len(attempts), states
