"""``dislockctl pause``, ``resume``, ``history`` and ``missed``: input checked before
connecting, then one or two statements each (SQL in ``dislock.core.pause`` and
``dislock.cli.fleet``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from dislock.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE


class Request(NamedTuple):
    history: tuple[str, ...]
    since: timedelta | None = None
    prune: timedelta | None = None
    grace: timedelta | None = None
    schedule: str | None = None
    zone: Any = None
    """The CronZone of ``--tz`` (None: the one recorded with the runs, else CRON_TZ/local)."""
    pause_for: timedelta | None = None
    pause_until: datetime | None = None


def read_request(
    args: argparse.Namespace, table: tuple[str, ...], env: Mapping[str, str]
) -> Request:
    """Raises ConfigurationError (exit 2) for bad durations, times, cron expressions."""
    from dislock.cli.fleet import parse_duration, parse_time
    from dislock.cli.settings import read_history_table
    from dislock.core.history import history_table

    command = args.command
    # Pauses live in the lock table: a history table name is not needed for them.
    history = (
        () if command in ("pause", "resume") else history_table(table, read_history_table(env))
    )
    if command == "history":
        if args.prune_older_than is not None:
            if args.lock_key is not None:
                from dislock.core.errors import ConfigurationError

                raise ConfigurationError("--prune-older-than prunes every key: drop LOCK_KEY")
            return Request(
                history, prune=parse_duration(args.prune_older_than, name="--prune-older-than")
            )
        return Request(history, since=parse_duration(args.since, name="--since"))
    if command == "missed":
        schedule = None
        if args.schedule is not None:
            from dislock.core.cron import check_cron

            schedule = check_cron(args.schedule, name="--schedule")
        zone = None
        if args.tz is not None:
            from dislock.core.cron import load_zone

            zone = load_zone(args.tz, name="--tz")
        return Request(
            history,
            since=parse_duration(args.since, name="--since"),
            grace=_grace(args.grace),
            schedule=schedule,
            zone=zone,
        )
    if command == "pause":
        from dislock.core.bounds import check_reason
        from dislock.core.config import check_text

        check_text("LOCK_KEY", args.lock_key)
        check_reason("--reason", args.reason)
        if args.for_ is not None:
            return Request(history, pause_for=parse_duration(args.for_, name="--for"))
        if args.until is not None:
            return Request(history, pause_until=parse_time(args.until, name="--until"))
    return Request(history)


def _grace(text: str) -> timedelta:
    from dislock.cli.fleet import parse_duration

    return timedelta(0) if text.strip() in ("0", "0s") else parse_duration(text, name="--grace")


def run_fleet_command(
    conn: Any, args: argparse.Namespace, table: tuple[str, ...], request: Request
) -> int:
    if args.command == "pause":
        return _pause(conn, table, args.lock_key, args.reason, request)
    if args.command == "resume":
        return _resume(conn, table, args.lock_key)
    if not _history_exists(conn, request.history):
        return EXIT_FAILURE
    if args.command == "history":
        if request.prune is not None:
            return _prune(conn, request)
        return _history(conn, table, request, args.lock_key, args.limit, args.json)
    return _missed(conn, table, request, args.lock_key, args.json)


def _error(message: str) -> None:
    print(f"dislockctl: error: {message}", file=sys.stderr)


def _history_exists(conn: Any, history: tuple[str, ...]) -> bool:
    from dislock.cli.fleet import table_exists_query

    query, params = table_exists_query(history)
    if conn.execute(query, params).fetchone()[0]:
        return True
    _error(
        f"history table {'.'.join(history)} does not exist: create it with "
        "`dislockctl URL_VARIABLE init --history` and set LOCK_HISTORY=1 on the wrappers"
    )
    return False


def _pause(conn: Any, table: tuple[str, ...], lock_key: str, reason: str, request: Request) -> int:
    from dislock.cli.admin import state_query
    from dislock.core.pause import UNTIL_RESUMED, describe_until, pause_params, pause_statement
    from dislock.core.sql import lease_key, schedule_key

    if request.pause_for is not None:
        end: dict[str, object] = {"seconds": request.pause_for.total_seconds()}
    else:
        end = {"until": request.pause_until or UNTIL_RESUMED}
    found = conn.execute(
        pause_statement(table, for_interval=request.pause_for is not None),
        pause_params(lock_key, reason, **end),
    ).fetchone()
    if found is None:
        _error(f"--until {request.pause_until} is not in the future (database clock)")
        return EXIT_USAGE
    why = f" ({reason})" if reason else ""
    print(
        f"paused {lock_key!r} {describe_until(found[0])}{why}: every dislock wrapper skips it "
        "(dislock 0.1.0 wrappers do not know pauses)"
    )
    known = conn.execute(
        state_query(table), {"keys": [schedule_key(lock_key), lease_key(lock_key)]}
    ).fetchall()
    if not known:
        print(f"note: {lock_key!r} has no lock row yet; check its spelling", file=sys.stderr)
    return EXIT_OK


def _resume(conn: Any, table: tuple[str, ...], lock_key: str) -> int:
    from dislock.core.pause import resume_statement
    from dislock.core.sql import pause_key

    found = conn.execute(resume_statement(table), {"key": pause_key(lock_key)}).fetchone()
    if found is None or not found[0]:
        _error(f"{lock_key!r} is not paused")
        return EXIT_FAILURE
    print(f"resumed {lock_key!r}: its next start runs")
    return EXIT_OK


def _prune(conn: Any, request: Request) -> int:
    from dislock.cli.admin import format_duration
    from dislock.cli.fleet import prune_query

    assert request.prune is not None
    (count,) = conn.execute(
        prune_query(request.history), {"older": request.prune.total_seconds()}
    ).fetchone()
    print(
        f"deleted {count} run(s) started more than {format_duration(request.prune.total_seconds())}"
        f" ago from {'.'.join(request.history)}"
    )
    return EXIT_OK


def _unknown_key(conn: Any, table: tuple[str, ...], request: Request, key: str) -> bool:
    from dislock.cli.fleet import known_key_params, known_key_query

    known = conn.execute(known_key_query(request.history, table), known_key_params(key))
    if known.fetchone()[0]:
        return False
    _error(f"no run of {key!r} is recorded in {'.'.join(request.history)} and it has no lock row")
    return True


def _history(
    conn: Any,
    table: tuple[str, ...],
    request: Request,
    key: str | None,
    limit: int,
    as_json: bool,
) -> int:
    from dislock.cli.admin import format_duration
    from dislock.cli.fleet import Run, dump, render_runs, runs_params, runs_query

    assert request.since is not None
    if key is not None and _unknown_key(conn, table, request, key):
        return EXIT_FAILURE
    runs = [
        Run(*row)
        for row in conn.execute(
            runs_query(request.history, table, by_key=key is not None),
            runs_params(key, request.since, limit),
        ).fetchall()
    ]
    if as_json:
        print(dump([run.as_json() for run in runs]))
    elif runs:
        print(render_runs(runs))
    else:
        what = f" of {key!r}" if key else ""
        print(f"no runs{what} in the last {format_duration(request.since.total_seconds())}")
    _warn_disagreements(conn, request, key)
    return EXIT_OK


def _warn_disagreements(conn: Any, request: Request, key: str | None) -> list[Any]:
    """Warn (on stderr, so that --json output stays clean) about keys whose runs
    read their schedule in different zones or expressions; returns the readings of
    ``key`` (all of them, for --json)."""
    from dislock.cli.fleet import Reading, describe_disagreement, disagreements, readings_query
    from dislock.core.bounds import escape

    assert request.since is not None
    (now,) = conn.execute("SELECT NOW()").fetchone()
    readings = [
        Reading(*row)
        for row in conn.execute(
            readings_query(request.history), {"key": key, "since": now - request.since}
        ).fetchall()
    ]
    for found_key, found in disagreements(readings).items():
        print(f"dislockctl: {escape(describe_disagreement(found_key, found))}", file=sys.stderr)
    return readings


def _missed(conn: Any, table: tuple[str, ...], request: Request, key: str, as_json: bool) -> int:
    from dislock.cli.fleet import (
        describe_missed,
        dump,
        from_first_run,
        missed_slots,
        render_missed,
        schedule_query,
        schedule_slots,
        span_of,
        spans_query,
        split_covered,
        starts_query,
    )
    from dislock.core.errors import ConfigurationError

    assert request.since is not None and request.grace is not None
    from dislock.core.cron import cron_zone, load_zone, recorded_zone

    schedule, zone = request.schedule, request.zone
    if schedule is None:
        recorded = conn.execute(schedule_query(request.history), {"key": key}).fetchone()
        if recorded is None:
            if _unknown_key(conn, table, request, key):
                return EXIT_FAILURE
            _error(f"no run of {key!r} recorded a schedule: pass --schedule CRON")
            return EXIT_USAGE
        schedule = str(recorded[0])
        if zone is None and recorded[1] is not None:
            try:
                # Any machine writing the history chose this text: an IANA name only,
                # never a path (a FIFO there would hang this command), as serve reads it.
                recorded_zone(recorded[1])
                zone = load_zone(recorded[1], name="the recorded cron_tz")
            except ConfigurationError as exc:
                _error(f"{exc}; pass --tz")
                return EXIT_USAGE
    if zone is None:
        try:
            zone = cron_zone()  # as the wrapper on this machine would read it
        except ConfigurationError as exc:
            _error(str(exc))
            return EXIT_USAGE
    (now,) = conn.execute("SELECT NOW()").fetchone()
    since = now - request.since
    rows = conn.execute(starts_query(request.history), {"key": key, "since": since}).fetchall()
    starts = [(started, slot_end) for _, started, slot_end, _ in rows if started is not None]
    try:
        slots = list(schedule_slots(schedule, since, now, request.grace, zone.tz))
    except ConfigurationError as exc:
        _error(str(exc))
        return EXIT_USAGE
    if not rows[0][3]:
        # A job new within the window did not miss the slots before it existed.
        slots = from_first_run(slots, starts)
    found = conn.execute(spans_query(request.history, table), {"key": key, "since": since})
    spans = [span for span in (span_of(*row) for row in found) if span is not None]
    missed, covered = split_covered(missed_slots(slots, starts), spans)
    readings = _warn_disagreements(conn, request, key)
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
                    "missed": [slot.as_json() for slot in missed],
                    "covered": [slot.as_json() for slot in covered],
                    "readings": [reading.as_json() for reading in readings],
                }
            )
        )
    else:
        if missed:
            print(render_missed(missed))
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
