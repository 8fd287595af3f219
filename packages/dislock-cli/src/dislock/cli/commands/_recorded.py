"""What ``history`` and ``missed`` both read of the recorded runs: whether a key is
known at all, and the keys whose runs read their schedule differently."""

from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

from dislock.cli.commands._call import error


def unknown_key(conn: Any, table: tuple[str, ...], history: tuple[str, ...], key: str) -> bool:
    """Whether ``key`` has neither a recorded run nor a lock row; if so, says so."""
    from dislock.cli.run_history import known_key
    from dislock.cli.sending import send

    if send(conn, known_key(history, table, key)):
        return False
    error(f"no run of {key!r} is recorded in {'.'.join(history)} and it has no lock row")
    return True


def warn_disagreements(
    conn: Any, history: tuple[str, ...], since: timedelta, key: str | None
) -> list[Any]:
    """Warn (on stderr, so that --json output stays clean) about keys whose runs
    read their schedule in different zones or expressions; returns the readings of
    ``key`` (all of them, for --json)."""
    from dislock.cli.run_history import describe_disagreement, disagreements, readings_of
    from dislock.cli.sending import send
    from dislock.core.bounds import escape

    (now,) = conn.execute("SELECT NOW()").fetchone()
    readings = send(conn, readings_of(history, now - since, key))
    for found_key, found in disagreements(readings).items():
        print(f"dislockctl: {escape(describe_disagreement(found_key, found))}", file=sys.stderr)
    return readings
