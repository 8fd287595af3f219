"""One wrapped run: take the locks, supervise the command, map outcomes to exit codes."""

from __future__ import annotations

import errno
import logging
import sys
import time
import traceback
from typing import Protocol

import psycopg
import psycopg.errors

from dislock import run_with_locks
from dislock.cli import EXIT_FAILURE, EXIT_USAGE
from dislock.cli.wrapper.settings import WrapperSettings
from dislock.core.dsn import scrub
from dislock.core.errors import (
    ConfigurationError,
    KeyNotGrantedError,
    LockDelayedError,
    LockNotAcquiredError,
)
from dislock.core.observing import Observer, note, observed
from dislock.core.supervision import FORWARDED_SIGNALS

logger = logging.getLogger("dislock")


class RunObserver(Observer, Protocol):
    """Told a run's notes (``dislock.core.observing``), then its exit status: the
    run's trace span (``dislock.cli.wrapper.tracing``)."""

    def ended(self, status: int) -> None: ...


def run(
    settings: WrapperSettings,
    *,
    debug: bool,
    metrics_textfile: str | None = None,
    observer: RunObserver | None = None,
) -> int:
    """The wrapped run; its exit status."""
    if observer is None:
        return _run(settings, debug, metrics_textfile)
    status = 128 + 2  # unless it returns: Ctrl-C, as the wrapper exits on it
    try:
        with observed(observer):
            status = _run(settings, debug, metrics_textfile)
    finally:
        observer.ended(status)
    return status


def _run(settings: WrapperSettings, debug: bool, metrics_textfile: str | None) -> int:
    context, program, url = settings.context, settings.command[0], settings.context.url
    try:
        started = time.time()
        status = run_with_locks(
            settings.command,
            context=context,
            strategies=settings.strategies,
            forward_signals=FORWARDED_SIGNALS,
            withheld_variables=() if settings.pass_url else (settings.url_variable,),
        )
    except LockNotAcquiredError as exc:
        # The expected outcome on every machine but one: quiet unless asked.  But a delay
        # holds up every key of the table, not just this one: an operator must hear of it,
        # or a fleet stopped by a long delay would be silent.
        level = logging.WARNING if isinstance(exc, LockDelayedError) else logging.INFO
        logger.log(level, "not running %s: %s", program, exc)
        note("not_acquired", reason=scrub(str(exc), url))
        return settings.conflict_exit_code
    except (ConfigurationError, KeyNotGrantedError) as exc:
        note("error", type=type(exc).__name__)
        print(f"dislock: error: {scrub(str(exc), url)}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, ConfigurationError) else EXIT_FAILURE
    except psycopg.errors.InsufficientPrivilege as exc:
        from dislock.cli._denied import explain_denial
        from dislock.cli.diagnosis import LOCK_TABLE

        tables = {LOCK_TABLE: tuple(context.table_parts)}
        message = explain_denial("", "dislock", exc, tables=tables, url=url, key=context.lock_key)
        return _fail(message, exc, url, debug)
    except psycopg.Error as exc:
        # Imported on failure only: a run that goes well never pays for the
        # diagnosis (and the grant catalogue and row views it reads).
        from dislock.cli.diagnosis import describe_database_error

        message = describe_database_error(exc, table_parts=tuple(context.table_parts), url=url)
        return _fail(message, exc, url, debug)
    except FileNotFoundError as exc:
        return _fail(f"cannot run {program!r}: command not found", exc, url, debug, 127)
    except PermissionError as exc:
        return _fail(f"cannot run {program!r}: permission denied", exc, url, debug, 126)
    except OSError as exc:
        if exc.errno != errno.ENOEXEC:  # no #! line, or a binary for another machine
            return _fail(f"{type(exc).__name__}: {exc}", exc, url, debug)
        # 126 and the wording of the shells and env(1): found, but it cannot be run.
        return _fail(f"cannot run {program!r}: exec format error", exc, url, debug, 126)
    except Exception as exc:
        return _fail(f"{type(exc).__name__}: {exc}", exc, url, debug)
    if metrics_textfile is not None:  # only runs that started their command get here
        from dislock.cli.wrapper.textfile import record

        record(metrics_textfile, context.lock_key, started, time.time(), status)
    return status


def _fail(
    message: str, exc: BaseException, url: str, debug: bool, status: int = EXIT_FAILURE
) -> int:
    note("error", type=type(exc).__name__)
    print(f"dislock: error: {scrub(message, url)}", file=sys.stderr)
    if debug:
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        print(scrub(trace, url), file=sys.stderr, end="")
    return status
