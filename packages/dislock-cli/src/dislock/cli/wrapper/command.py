"""The ``dislock`` command: run a command under a PostgreSQL lock, from a crontab.  Here its
command line and ``--help``; ``dislock.cli.wrapper.run`` takes the locks."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import NoReturn

from dislock.cli import EXIT_OK, EXIT_USAGE, __version__, exit_now

USAGE = "usage: dislock URL_VARIABLE command [args...]   (dislock --help for details)"

_HELP_HEAD = f"""\
{USAGE.split("   ")[0]}

Run COMMAND under a lock kept in PostgreSQL, so that the same crontab entry on
many machines starts the job once per schedule slot, or runs one copy at a time.

URL_VARIABLE is the NAME of the environment variable holding the database URL
(e.g. DATABASE_URL), so that the password never appears in `ps` or cron mail.
From cron, keep the URL in a file only the job's user can read (chmod 600),
/etc/dislock/jobs.env: `set -a`, then a DATABASE_URL=... line. Each job line
reads it with `.` before dislock:
  0 3 * * * . /etc/dislock/jobs.env && LOCK_KEY=... dislock DATABASE_URL cmd
Not a DATABASE_URL= line in the crontab: Debian's cron copies those into every
mail it sends. Never the URL on the job line: `ps` and the mail's subject show
it. Under systemd, EnvironmentFile= does what the file does.

environment:
"""

_HELP_TAIL = """\
exit status:
  the command's own (128+n if signal n killed it; 127 not found, 126 not
  executable, both reported before any lock is taken; 126 also for a file
  that is no program, such as a script without a #! line)
  0   also when another machine holds the lock (logged at INFO only), after
      any wait, or the key is paused (dislockctl pause; the line names the
      reason), or the slot is not to start (past LOCK_START_DEADLINE_SECONDS,
      waiting for a retry's delay, attempts used up); LOCK_CONFLICT_EXIT_CODE
      sets another status for these cases
  128+n  signal n arrived before the command started (jitter or wait)
  1   runtime failure: database unreachable, table missing, ...
  2   invalid configuration or usage
  75  the lease was lost and the command was terminated, or a newer run took
      it over (LOCK_REPLACE=1)
  124 the command ran past LOCK_MAX_RUNTIME_SECONDS and was stopped

The command runs in its own process group. TERM, INT, HUP, QUIT, USR1 and USR2
sent to dislock are passed on to that group, and the lock is released once no
process of the group is left (stragglers get TERM, then KILL after 10 s). If
dislock itself dies, even by SIGKILL, the whole group is killed; a process that
leaves the group (setsid, a daemon) escapes: see docs/guarantees.md.

The lock table (or: dislockctl URL_VARIABLE init):
  CREATE TABLE key_value (key text PRIMARY KEY, value text NOT NULL,
                          expire_at timestamptz NOT NULL);
"""


def help_text() -> str:
    """What ``dislock --help`` prints: its environment section is the table of
    ``dislock.core.variables``."""
    return _HELP_HEAD + "".join(f"{line}\n" for line in help_lines()) + "\n" + _HELP_TAIL


NAME_WIDTH = 23
DEFAULT_WIDTH = 11
HELP_WIDTH = 80


def help_lines() -> Iterator[str]:
    """The ``environment:`` section of ``dislock --help``: a variable, its default,
    and its text wrapped in a column of its own."""
    indent = 2 + NAME_WIDTH + DEFAULT_WIDTH
    from dislock.core.variables import VARIABLES

    for variable in VARIABLES:
        name = f"  {variable.name}"
        if len(variable.name) >= NAME_WIDTH:
            yield name
            name = ""
        lines = _wrap(variable.describe(), HELP_WIDTH - indent)
        yield f"{name:<{2 + NAME_WIDTH}}{variable.default:<{DEFAULT_WIDTH}}{lines[0]}"
        yield from (" " * indent + line for line in lines[1:])


def _wrap(text: str, width: int) -> list[str]:
    # textwrap would import re and more at every `--help`; greedy word wrap is enough.
    lines = [""]
    for word in text.split():
        if lines[-1] and len(lines[-1]) + 1 + len(word) > width:
            lines.append(word)
        else:
            lines[-1] = f"{lines[-1]} {word}" if lines[-1] else word
    return lines


logger = logging.getLogger("dislock")


def configure_logging(named: logging.Logger, prefix: str, level: int) -> logging.Handler:
    """``named``'s records, from ``level`` on, as lines on stderr after ``prefix``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{prefix}: %(message)s"))
    named.handlers[:] = [handler]
    named.setLevel(level)
    named.propagate = False
    return handler


def console_main() -> NoReturn:
    """The ``dislock`` console script: :func:`main`, then ``dislock.cli.exit_now``."""
    exit_now(main())


def _open_standard_streams() -> None:
    """``/dev/null`` on each of descriptors 0, 1 and 2 that we were started without."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run the ``dislock`` command line; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if environ is None else environ

    if args and args[0] in ("-h", "--help"):
        sys.stdout.write(help_text())
        return EXIT_OK
    if args and args[0] == "--version":
        print(f"dislock-cli {__version__}")
        return EXIT_OK

    # Deferred imports keep `--help` instant; the rest costs psycopg and no more.
    from dislock.cli.wrapper.settings import parse_log_level, read_wrapper_settings
    from dislock.core.errors import ConfigurationError

    level, level_warning = parse_log_level(env)
    handler = configure_logging(logger, "dislock", level)
    if level > logging.DEBUG:
        # The wrapper reports a lost lease in one line of its own; the locks' notes
        # on it (worded for Python callers) only when debugging.
        from dislock.core.supervision import LOSS_LOGGER

        handler.addFilter(lambda record: record.name != LOSS_LOGGER)
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
    for unknown in settings.unknown:
        logger.warning("%s", unknown.describe())

    if settings.context.output_tail_bytes:
        # Its output is copied to our descriptors 1 and 2: those must be the streams
        # we were given, not the first files opened (a database socket).
        _open_standard_streams()
    from dislock.cli.wrapper.run import run
    from dislock.core.variables import METRICS_TEXTFILE

    span = None
    if any(name.startswith("OTEL_") for name in env):  # else not even the module is read
        from dislock.cli.wrapper.tracing import run_span

        span = run_span(settings, env)
    try:
        textfile: str | None = METRICS_TEXTFILE.read(env)
        debug = level <= logging.DEBUG
        return run(settings, debug=debug, metrics_textfile=textfile, observer=span)
    except KeyboardInterrupt:  # Ctrl-C while sleeping the jitter or taking the lock
        print("dislock: interrupted", file=sys.stderr)
        return 128 + 2
