"""``dislockctl check``: validate the wrapper's environment (every variable it
reads, as the wrapper does: ``dislock.cli.wrapper.settings``; a variable named like one
that none is fails it) and show what a run would do now, on the database's clock,
acquiring nothing: the schedule's next fires, the lease's timing, the table's limits, a
running lock delay and the state of the run's lock rows."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from typing import TYPE_CHECKING

from dislock.cli import EXIT_OK, EXIT_USAGE
from dislock.cli.commands._call import Call, beside, columns, error
from dislock.cli.sending import send

if TYPE_CHECKING:
    from dislock.cli.sending import Connection
    from dislock.cli.wrapper.settings import WrapperSettings
    from dislock.core.context import LockContext


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``check`` takes no arguments of its own: it reads the wrapper's variables."""


def run(call: Call) -> int:
    from dislock.cli.wrapper.settings import read_wrapper_settings
    from dislock.core.unknown_variables import unknown_variables

    # Said before the likely typos among them stop the reading (an error, exit 2).
    for found in unknown_variables(call.env, call.args.url_variable):
        if found.resembles is None:
            print(f"dislockctl: warning: {found.describe()}", file=sys.stderr)
    settings = read_wrapper_settings(call.args.url_variable, ["true"], call.env)
    status = call.connected(lambda conn: _check(conn, settings))
    return status or (EXIT_USAGE if settings.unknown else EXIT_OK)


def _check(conn: Connection, settings: WrapperSettings) -> int:
    from dislock.cli.admin import DATABASE_NOW, refusing_writes
    from dislock.core.protocol import installed

    table_parts = tuple(settings.context.table_parts)
    refusal = send(conn, refusing_writes())  # a standby, a read-only session
    if refusal:
        return error(refusal)
    _explain_a_missing_table(conn, settings.context)
    now = send(conn, DATABASE_NOW)
    unread = " but for the variables named above, which no run reads" if settings.unknown else ""
    print(f"configuration is valid{unread}")
    _print_timing(settings, now)
    _print_run_rules(settings)
    _print_history(conn, settings.context)
    print(f"  database now    {now.isoformat(timespec='seconds')}")
    if _print_max_ttl(conn, table_parts, settings):
        return EXIT_USAGE
    if beside(conn, table_parts, installed):
        print("  lock functions  installed (one call per lock step)")
    else:
        print(
            "  lock functions  not installed: plain statements are sent (dislockctl URL_VARIABLE"
            " init adds the functions: one call per lock step, plans kept by the server)"
        )
    _print_lock_delay(conn, table_parts)
    _print_replication(conn)
    _print_lock_state(conn, settings, now)
    return EXIT_OK


def _explain_a_missing_table(conn: Connection, context: LockContext) -> None:
    """Raise, for the usual diagnosis to explain, when the table or a column the run
    needs is missing, as the wrapper would meet it."""
    from psycopg import sql

    from dislock.cli.lock_rows import states

    table_parts = tuple(context.table_parts)
    present = columns(conn, table_parts)
    missing = {"key", "value", "expire_at", *(["fence"] if context.fencing else [])} - set(present)
    if not present or missing:
        send(conn, states(table_parts, []))
        conn.execute(
            sql.SQL("SELECT {} FROM {} LIMIT 0").format(
                sql.SQL(", ").join(sql.Identifier(name) for name in sorted(missing)),
                sql.Identifier(*table_parts),
            )
        )


def _print_timing(settings: WrapperSettings, now: datetime) -> None:
    from dislock.core.bounds import escape
    from dislock.core.cron import next_fires, slot_end
    from dislock.core.lease_clock import LeaseClock, LeaseSettings

    context = settings.context
    print(f"  lock key        {escape(context.lock_key)}")
    print(f"  strategies      {','.join(settings.strategies)}")
    print(f"  table           {'.'.join(context.table_parts)}")
    if context.schedule is not None and settings.cron_zone is not None:
        zone = settings.cron_zone
        boundary = slot_end(context.schedule, now, zone.tz)
        print(f"  schedule        {context.schedule}")
        print(f"  time zone       {zone.name} (from {zone.source})")
        local = boundary.astimezone(zone.tz).isoformat()
        print(f"  slot ends       {boundary.isoformat()} (database clock, UTC; {local} local)")
        # Read from the fires, a schedule meant for another field order shows at once.
        for number, fire in enumerate(next_fires(context.schedule, now, zone.tz)):
            label = "next fires" if number == 0 else ""
            print(f"  {label:<15} {fire.astimezone(zone.tz).isoformat()}")
    if "lease" in settings.strategies:
        lease = LeaseSettings.from_context(context)
        cadence = LeaseClock(lease, acquired_at=0.0).cadence
        print(f"  lease TTL       {lease.ttl:g} s")
        heartbeat = f"  heartbeat       {lease.interval:g} s"
        if cadence < lease.interval:
            heartbeat += f" (renews every {cadence:g} s to stay ahead of its deadline)"
        print(heartbeat)
        print(f"  on lease loss   {lease.policy.value}")


def _print_run_rules(settings: WrapperSettings) -> None:
    context = settings.context
    print(f"  startup jitter  up to {context.jitter_max_seconds:g} s")
    if context.max_runtime_seconds is not None:
        print(
            f"  max runtime     {context.max_runtime_seconds:g} s (then SIGTERM, SIGKILL 10 s"
            " later, exit 124)"
        )
    if context.retries:
        print(
            f"  retries         {context.retries} more attempts in a failed slot, the first"
            f" {context.retry_delay_seconds:g} s after the failure (twice as long after each"
            " further one); each needs a wrapper that starts within the slot after it, so the"
            " crontab line must tick more often than the schedule"
        )
    if context.start_deadline_seconds is not None:
        print(
            f"  start deadline  {context.start_deadline_seconds:g} s after the slot began"
            " (later, the slot is marked late and not started)"
        )
    if context.wait_seconds > 0:
        how = "LISTEN on a direct connection, else polling"
        if context.wait_listen is not None:
            how = "LISTEN" if context.wait_listen else "polling"
        print(
            f"  wait            up to {context.wait_seconds:g} s"
            f" ({how}; polls every {context.wait_poll_seconds:g} s)"
        )
    if context.slots > 1:
        print(f"  slots           {context.slots} holders at once")
    if context.replace:
        print(
            "  replace         a running copy is asked to stop (it exits 75); this one starts"
            " once it is gone"
        )
    if settings.conflict_exit_code:
        print(f"  when held       exit {settings.conflict_exit_code}")
    print(f"  fencing         {'on' if context.fencing else 'off'}")


def _print_history(conn: Connection, context: LockContext) -> None:
    if not context.history:
        print("  history         off")
        return
    from dislock.cli.runs.envelope import describe, successes_before
    from dislock.core.history import history_table

    runs = history_table(tuple(context.table_parts), context.history_table)
    found_columns = columns(conn, runs)
    state = "" if found_columns else " (MISSING: dislockctl init --history; runs log a warning)"
    print(f"  history         {'.'.join(runs)}{state}")
    if found_columns:
        (envelope,) = send(conn, successes_before(runs, [(context.lock_key, None)]))
        if envelope is not None:
            print(f"  runtime         {describe(envelope)}")
    if context.output_tail_bytes:
        missing = bool(found_columns) and "stdout_tail" not in found_columns
        tails = " (its columns are MISSING: dislockctl init --history adds them)" if missing else ""
        print(
            f"  output tail     the last {context.output_tail_bytes} bytes of stdout and of"
            f" stderr, kept for a run that fails{tails}"
        )


def _print_lock_state(conn: Connection, settings: WrapperSettings, now: datetime) -> None:
    from dislock.cli.admin import describe_expiry, format_duration
    from dislock.cli.lock_rows import states
    from dislock.core.bounds import MAX_REASON_BYTES, clip
    from dislock.core.kinds import kind
    from dislock.core.rows import pause_key

    context = settings.context
    slots = {name: context.slots if kind(name).renewed else 1 for name in settings.strategies}
    keys = {
        name: [kind(name).row_key(context.lock_key, n) for n in range(1, slots[name] + 1)]
        for name in settings.strategies
    }
    paused = pause_key(context.lock_key)
    wanted = [paused, *(key for group in keys.values() for key in group)]
    found = {
        row.key: (row.owner, row.seconds_left)
        for row in send(conn, states(tuple(context.table_parts), wanted))
    }
    busy = "wait" if context.wait_seconds > 0 else "skip"
    print("lock state")
    reason, left = found.get(paused, ("", 0.0))
    if left > 0:
        why = f": {clip(reason, MAX_REASON_BYTES)}" if reason else ""
        span = "until resumed" if left > 100 * 365 * 86400 else f"for {format_duration(left)}"
        print(f"  paused          {span}{why}: a run now would skip")
    for strategy in settings.strategies:
        held = [found[key] for key in keys[strategy] if key in found and found[key][1] > 0]
        if slots[strategy] > 1:
            state = f"{len(held)}/{slots[strategy]} slots held: a run now would " + (
                busy if len(held) == slots[strategy] else "take one"
            )
        elif not held:
            state = "free: a run now would " + (
                "mark it late and not start (past its start deadline)"
                if strategy == "schedule" and _past_deadline(context, now)
                else "take it"
            )
        else:
            owner, remaining = held[0]
            expires = describe_expiry(remaining)
            state = f"held by {clip(owner)}, expires {expires}: a run now would {busy}"
        print(f"  {strategy:<14}  {state}")


def _print_max_ttl(conn: Connection, table: tuple[str, ...], settings: WrapperSettings) -> bool:
    """The table's maximum lease TTL; whether the configured lease exceeds it (said)."""
    from dislock.core.lease_clock import LeaseSettings
    from dislock.core.limits import max_ttl, too_long
    from dislock.core.variables import TTL

    cap, recorded = send(conn, max_ttl(table))
    print(f"  max lease TTL   {cap:g} s" + ("" if recorded else " (the default)"))
    if "lease" not in settings.strategies:
        return False
    ttl = LeaseSettings.from_context(settings.context).ttl
    if ttl > cap:
        error(f"{TTL.name}: {too_long(ttl, cap)}")
    return ttl > cap


def _print_lock_delay(conn: Connection, table: tuple[str, ...]) -> None:
    """The server timeline and the lock delay after a failover (dislock.core.failover)."""
    from dislock.cli.admin import describe_expiry
    from dislock.core.failover import delay_state

    state = send(conn, delay_state(table))
    if state is None:
        print("  timeline        not recorded yet (the first lock taken records it)")
        return
    line = f"  timeline        {state.server}"
    if state.recorded != state.server:
        line += (
            f" (recorded {state.recorded}: the next lock taken starts a lock delay after failover)"
        )
    elif state.seconds_left > 0:
        line += (
            "; lock delay after failover: each key waits for the longest TTL of the roles"
            f" that may hold it, the last ends {describe_expiry(state.seconds_left)}"
        )
    print(line)


def _print_replication(conn: Connection) -> None:
    """The server's streaming standbys and whether a commit waits for one: what a
    failover can cost the lock table (docs/guarantees.md#failover-and-replication)."""
    row = conn.execute(
        "SELECT current_setting('synchronous_standby_names'),"
        " current_setting('synchronous_commit'),"
        # Without pg_read_all_stats (pg_monitor has it) a role sees a standby's
        # process, but not its name nor its state.
        " pg_has_role(current_user, 'pg_read_all_stats', 'USAGE'),"
        " ARRAY(SELECT format('%s (%s)', application_name, sync_state) FROM pg_stat_replication"
        " WHERE state IS DISTINCT FROM 'startup' ORDER BY application_name)"
    ).fetchone()
    assert row is not None
    names, commit, permitted, standbys = row
    if not permitted:
        line = f"{len(standbys)} (names and states need pg_monitor, which this role lacks)"
    else:
        line = f"{len(standbys)}" + (f": {', '.join(standbys)}" if standbys else "")
    print(f"  standbys        {line}")
    waits = bool(names) and commit not in ("off", "local")
    print(
        f"  synchronous     {'yes' if waits else 'no'}: a commit waits for "
        + ("a standby" if waits else "no standby")
        + f" (synchronous_standby_names={names!r}, synchronous_commit={commit})"
    )


def _past_deadline(context: LockContext, now: datetime) -> bool:
    """Whether the current slot began more than ``start_deadline_seconds`` ago, on the
    database clock: the wrapper would mark it late rather than start it."""
    from dislock.core.cron import begun_too_long_ago, slot_end

    zone, schedule, deadline = context.cron_zone, context.schedule, context.start_deadline_seconds
    if deadline is None or schedule is None or zone is None:
        return False
    end = slot_end(schedule, now, zone.tz)
    return begun_too_long_ago(schedule, end, zone.tz, deadline, now) is not None
