"""``dislockctl missed``: the slots of LOCK_KEY's schedule in which no run started
(exit 1 if any), judged from the recorded runs; slots a longer run covered are
told apart."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any, NamedTuple

from dislock.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from dislock.cli.commands._call import Call, error
from dislock.cli.commands._recorded import unknown_key, warn_disagreements

LATE = "late"
"""The outcome of a slot that an acquisition past its start deadline marked late."""
NO_START = (LATE, "rerun")
"""Outcomes of history rows that are not a run of the job (``dislock.core.rerun``)."""


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
    asked = _Asked(parse_duration(args.since, name="--since"), _grace(args.grace), schedule, zone)
    return call.on_history(
        history, lambda conn: _missed(conn, call.table, history, asked, args.lock_key, args.json)
    )


def _grace(text: str) -> timedelta:
    from dislock.cli.time_args import parse_duration

    return timedelta(0) if text.strip() in ("0", "0s") else parse_duration(text, name="--grace")


def _missed(
    conn: Any,
    table: tuple[str, ...],
    history: tuple[str, ...],
    asked: _Asked,
    key: str,
    as_json: bool,
) -> int:
    from dislock.cli.history_report import describe_missed, dump, render_missed
    from dislock.cli.missed_slots import (
        from_first_run,
        missed_slots,
        schedule_slots,
        span_of,
        spans_query,
        split_covered,
        starts_query,
    )
    from dislock.cli.run_history import recorded_schedule
    from dislock.cli.sending import send
    from dislock.core.cron_zone import cron_zone, load_zone, recorded_zone
    from dislock.core.errors import ConfigurationError

    schedule, zone = asked.schedule, asked.zone
    if schedule is None:
        recorded = send(conn, recorded_schedule(history, key))
        if recorded is None:
            if unknown_key(conn, table, history, key):
                return EXIT_FAILURE
            error(f"no run of {key!r} recorded a schedule: pass --schedule CRON")
            return EXIT_USAGE
        schedule = recorded.cron
        if zone is None and recorded.cron_tz is not None:
            try:
                # Any machine writing the history chose this text: an IANA name only,
                # never a path (a FIFO there would hang this command), as serve reads it.
                recorded_zone(recorded.cron_tz)
                zone = load_zone(recorded.cron_tz, name="the recorded cron_tz")
            except ConfigurationError as exc:
                error(f"{exc}; pass --tz")
                return EXIT_USAGE
    if zone is None:
        try:
            zone = cron_zone()  # as the wrapper on this machine would read it
        except ConfigurationError as exc:
            error(str(exc))
            return EXIT_USAGE
    (now,) = conn.execute("SELECT NOW()").fetchone()
    since = now - asked.since
    rows = conn.execute(starts_query(history), {"key": key, "since": since}).fetchall()
    # A slot marked late (past its start deadline, nobody started it) has a row but no
    # start: it is judged as missed, and said to be late.  A rerun's row is no start either.
    late = {slot_end for _, started, slot_end, outcome, _ in rows if outcome == LATE}
    starts = [
        (started, slot_end)
        for _, started, slot_end, outcome, _ in rows
        if started is not None and outcome not in NO_START
    ]
    try:
        slots = list(schedule_slots(schedule, since, now, asked.grace, zone.tz))
    except ConfigurationError as exc:
        error(str(exc))
        return EXIT_USAGE
    if not rows[0][4]:
        # A job new within the window did not miss the slots before it existed.
        slots = from_first_run(slots, starts)
    found = conn.execute(spans_query(history, table), {"key": key, "since": since})
    spans = [span for span in (span_of(*row) for row in found) if span is not None]
    missed, covered = split_covered(missed_slots(slots, starts), spans)
    readings = warn_disagreements(conn, history, asked.since, key)
    if as_json:
        print(
            dump(
                {
                    "key": key,
                    "schedule": schedule,
                    "tz": zone.name,
                    "since": since.isoformat(),
                    "until": now.isoformat(),
                    "slots": len(slots),
                    "runs": len(starts),
                    "missed": [
                        {**slot.as_json(), "state": "late" if slot.end in late else "missed"}
                        for slot in missed
                    ],
                    "covered": [slot.as_json() for slot in covered],
                    "readings": [reading.as_json() for reading in readings],
                }
            )
        )
    else:
        if missed:
            print(render_missed(missed, late))
        print(
            describe_missed(
                key,
                schedule,
                zone.name,
                since,
                judged=len(slots),
                missed=len(missed),
                covered=len(covered),
            )
        )
    return EXIT_FAILURE if missed else EXIT_OK
