"""Run ends the database could not take: kept on the host, recorded by a later run.

An end not recorded within the connect patience (``dislock.core.history.retry_end``)
would leave the run read as ``abandoned``, as if its machine had died; so it is
written to a small file of this user's (``spool_dir``), and the next run with
history on this host, for the same database, role and table, records it
(``late_end``: at the time the run really ended, unless an end was recorded
meanwhile), then deletes the file (docs/cli.md).

Nothing here connects.  ``json`` and ``hashlib`` are imported only once there is a
file to read or write: a run on a host that kept nothing pays one failed ``scandir``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from dislock.core.dsn import parse_dsn
from dislock.core.history import RunEnd

SUFFIX = ".end.json"
MAX_FLUSHED = 20
"""How many kept ends one run records at most: a host with many stays cheap to start."""


class KeptEnd(NamedTuple):
    """The end of run ``run_id`` of history ``table``, as it happened."""

    table: tuple[str, ...]
    run_id: int
    end: RunEnd
    ended_at: datetime


def spool_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where this user's kept ends are: ``$XDG_STATE_HOME/dislock/unrecorded`` (by
    default ``~/.local/state/dislock/unrecorded``)."""
    state = environ.get("XDG_STATE_HOME") or os.path.join(
        environ.get("HOME") or os.path.expanduser("~"), ".local", "state"
    )
    return Path(state) / "dislock" / "unrecorded"


def database_id(url: str, table: tuple[str, ...]) -> str:
    """Which database, role and history table an end belongs to, without anything
    secret: a digest of the URL's host, port, database and user, and the table."""
    import hashlib

    params = parse_dsn(url)
    named = [str(params.get(name) or "") for name in ("host", "port", "dbname", "user")]
    text = "\0".join([*named, *table])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def keep(url: str, kept: KeptEnd, environ: Mapping[str, str] = os.environ) -> Path:
    """Write ``kept`` for a later run to record; the file's path.  Raises OSError."""
    import json

    folder = spool_dir(environ)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{database_id(url, kept.table)}-{kept.run_id}{SUFFIX}"
    data = {
        "table": list(kept.table),
        "run_id": kept.run_id,
        # (Not the output's tail: a file on the host is no place for it.)
        "end": {name: getattr(kept.end, name) for name in ("outcome", "exit_code", "signal")},
        "ended_at": kept.ended_at.isoformat(),
    }
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data))
    temporary.replace(path)  # whole or not at all: a later run never reads half a file
    return path


def kept_ends(
    url: str, table: tuple[str, ...], environ: Mapping[str, str] = os.environ
) -> Iterator[tuple[Path, KeptEnd]]:
    """The ends kept for ``url``'s database, role and ``table``, oldest first, at most
    ``MAX_FLUSHED``; a file that cannot be read is skipped (and left alone)."""
    try:
        entries = list(os.scandir(spool_dir(environ)))
    except OSError:  # no folder yet: nothing kept
        return
    prefix = f"{database_id(url, table)}-"
    try:
        names = sorted(
            (e for e in entries if e.name.startswith(prefix) and e.name.endswith(SUFFIX)),
            key=lambda e: e.stat().st_mtime,
        )
    except OSError:  # a file recorded and deleted by a run beside this one
        return
    for entry in names[:MAX_FLUSHED]:
        path = Path(entry.path)
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            yield path, _read(path.read_text())


def _read(text: str) -> KeptEnd:
    import json

    data: dict[str, Any] = json.loads(text)
    end = data["end"]
    return KeptEnd(
        tuple(str(part) for part in data["table"]),
        int(data["run_id"]),
        RunEnd(str(end["outcome"]), end.get("exit_code"), end.get("signal")),
        datetime.fromisoformat(data["ended_at"]),
    )


def forget(path: Path) -> None:
    """Delete a kept end once recorded (or found recorded already)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
