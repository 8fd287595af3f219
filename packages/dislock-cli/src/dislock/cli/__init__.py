"""The ``dislock`` command: run a command under a PostgreSQL lock, from a crontab.

    dislock URL_VARIABLE command [args...]

Exit codes: the command's own; 0 (or LOCK_CONFLICT_EXIT_CODE) when another
machine holds the lock; 128+n on signal n before the command started; 1 on
a runtime failure; 2 on bad configuration or usage; 75 when the lease was lost
and the command was terminated.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

__version__ = "0.2.0"

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

USAGE = "usage: dislock URL_VARIABLE command [args...]   (dislock --help for details)"

HELP = f"""\
{USAGE.split("   ")[0]}

Run COMMAND under a lock kept in PostgreSQL, so that the same crontab entry on
many machines starts the job once per schedule slot, or runs one copy at a time.

URL_VARIABLE is the NAME of the environment variable holding the database URL
(e.g. DATABASE_URL), so that the password never appears in `ps` or cron logs.
In a crontab, set it on a line of its own above the jobs (crontab has no
`export`): DATABASE_URL=postgresql://...  Never on the job line itself, where
`ps` and the subject of cron's mail would show the password.

environment:
  LOCK_KEY               required   name of the lock shared by every machine
                                    (at most 2048 bytes, no control characters)
  LOCK_STRATEGY          schedule   schedule, lease, or schedule,lease
  CRON_SCHEDULE          -          cron expression; required for schedule
                                    (5 fields, or 6 with seconds last; must fire)
  CRON_TZ                local zone IANA zone CRON_SCHEDULE is read in, like
                                    cron: default TZ, else /etc/localtime
  LOCK_TABLE             key_value  table, or schema.table
  RUN_LOCK_TTL_SECONDS   60         lease time-to-live: 0.1 to 604800 s
  LOCK_LEASE_INTERVAL    derived    heartbeat: 0.001 to 604800 s, <= TTL;
                                    default 30 % of the TTL kept within 1..10 s
  LOCK_JITTER_SECONDS    0          sleep up to this long before locking: 0 to
                                    3600 s, and with a schedule at most half
                                    its shortest interval
  LOCK_ON_LEASE_LOSS     terminate  terminate (SIGTERM, SIGKILL after 10 s,
                                    exit 75) or continue (log only)
  LOCK_FENCING           0          1: pass a fencing token to the command in
                                    DISLOCK_FENCING_TOKEN (dislockctl init --fencing)
  LOCK_PASS_URL          1          0: the command does not inherit URL_VARIABLE
                                    (give dislock a lock role and a variable of
                                    its own, e.g. DISLOCK_URL)
  LOCK_WAIT_SECONDS      0          wait up to this long for a lease held
                                    elsewhere, then skip: 0 to 86400 s (needs
                                    lease; with schedule,lease the slot is
                                    taken once and the lease waited for)
  LOCK_WAIT_POLL_SECONDS 0.5        poll cadence while waiting without LISTEN:
                                    more than 0 to 3600 s
  LOCK_WAIT_LISTEN       auto       auto: woken by the release (LISTEN/NOTIFY)
                                    on a direct connection, polling behind a
                                    pooler such as PgBouncer; 1 always; 0 never
  LOCK_SLOTS             1          up to N holders of the lease at once: 1 to
                                    1000
  LOCK_CONFLICT_EXIT_CODE 0         exit status when the lock is held elsewhere:
                                    0 to 255
  LOCK_CONNECT_PATIENCE_SECONDS
                         30         retry a refused connection (too many
                                    connections, server starting or restarting)
                                    this long (0 to 3600 s), never past the
                                    schedule slot; 0: fail at once
  LOCK_HISTORY           0          1: record each run in the history table
                                    (dislockctl init --history)
  LOCK_HISTORY_TABLE     derived    default: <LOCK_TABLE>_history
  CRONJOB_LOCK_LOG_LEVEL WARNING    DEBUG, INFO, WARNING, ERROR, CRITICAL
  DISLOCK_METRICS_TEXTFILE  -       after each run, write its metrics to this
                                    node_exporter textfile (e.g. .../dislock.prom)

exit status:
  the command's own (128+n if signal n killed it; 127 not found, 126 not
  executable, both reported before any lock is taken)
  0   also when another machine holds the lock (logged at INFO only), after
      any wait, or the key is paused (dislockctl pause; the line names the
      reason); LOCK_CONFLICT_EXIT_CODE sets another status for these cases
  128+n  signal n arrived before the command started (jitter or wait)
  1   runtime failure: database unreachable, table missing, ...
  2   invalid configuration or usage
  75  the lease was lost and the command was terminated

The command runs in its own process group. TERM, INT, HUP, QUIT, USR1 and USR2
sent to dislock are passed on to that group, and the lock is released once no
process of the group is left (stragglers get TERM, then KILL after 10 s). If
dislock itself dies, even by SIGKILL, the whole group is killed; a process that
leaves the group (setsid, a daemon) escapes: see docs/guarantees.md.

The lock table (or: dislockctl URL_VARIABLE init):
  CREATE TABLE key_value (key text PRIMARY KEY, value text NOT NULL,
                          expire_at timestamptz NOT NULL);
"""

logger = logging.getLogger("dislock")


def _configure_logging(level: int) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("dislock: %(message)s"))
    if level > logging.DEBUG:
        # The wrapper reports a lost lease in one line of its own; the locks' notes
        # on it (worded for Python callers) only when debugging.
        from dislock.core.supervision import LOSS_LOGGER

        handler.addFilter(lambda record: record.name != LOSS_LOGGER)
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False


def console_main() -> NoReturn:
    """The ``dislock`` console script (and ``python -m dislock.cli``): :func:`main`, then
    an exit that skips the interpreter's teardown (see ``dislock.cli._exit``)."""
    status = main()
    from dislock.cli._exit import exit_now

    exit_now(status)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the ``dislock`` command line; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if environ is None else environ

    if args and args[0] in ("-h", "--help"):
        sys.stdout.write(HELP)
        return EXIT_OK
    if args and args[0] == "--version":
        print(f"dislock-cli {__version__}")
        return EXIT_OK

    # Deferred imports keep `--help` instant; the rest costs psycopg and no more.
    from dislock.cli.settings import parse_log_level, read_wrapper_settings
    from dislock.core.errors import ConfigurationError

    level, level_warning = parse_log_level(env)
    _configure_logging(level)
    if level_warning:
        logger.warning("%s", level_warning)

    if not args:
        print(f"dislock: error: no database URL variable and no command\n{USAGE}", file=sys.stderr)
        return EXIT_USAGE
    try:
        settings = read_wrapper_settings(args[0], args[1:], env)
    except ConfigurationError as exc:
        print(f"dislock: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    from dislock.cli._run import run

    try:
        textfile = env.get("DISLOCK_METRICS_TEXTFILE", "").strip() or None
        return run(settings, debug=level <= logging.DEBUG, metrics_textfile=textfile)
    except KeyboardInterrupt:  # Ctrl-C while sleeping the jitter or taking the lock
        print("dislock: interrupted", file=sys.stderr)
        return 128 + 2
