"""A lock key's own page, at ``/key/<its name, URL-encoded>``: its row of the status
page (with its slot strip), its newest runs and its audit trail's lines; a name no key
has is 404.

The runs and the trail are read in read-only transactions of their own, at most
``KEY_RUNS`` of each, every text clipped and escaped as on the main page.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timezone
from html import escape
from typing import TYPE_CHECKING
from urllib.parse import unquote

from dislock.cli.admin import format_duration
from dislock.cli.commands.audit import entry_line
from dislock.cli.runs.envelope import mark
from dislock.cli.serve.status_page import (
    _STYLE,
    REFRESH_SECONDS,
    _badge,
    _clip,
    _row,
    _when,
    keys_head,
)
from dislock.cli.serve.strip_html import key_strip, legend, strip_style
from dislock.core.bounds import MAX_STORED_BYTES, SHOWN_CHARS

if TYPE_CHECKING:
    from dislock.cli.runs.run_history import Run
    from dislock.cli.serve.fleet_reader import FleetReader
    from dislock.cli.serve.fleet_status import FleetSnapshot, KeyStatus

KEY_PATH = "/key/"

KEY_RUNS = 50
"""Runs a key's page lists at most, newest first."""

_TEXT = "text/plain; charset=utf-8"
_HTML = "text/html; charset=utf-8"


def key_page(reader: FleetReader, path: str) -> tuple[int, str, bytes]:
    """The answer to ``GET /key/...``: status, content type and body."""
    lock_key = unquote(path[len(KEY_PATH) :], errors="replace")
    if not lock_key or len(lock_key) > MAX_STORED_BYTES:
        return 404, _TEXT, b"no such lock key\n"
    snapshot = reader.snapshot()
    if not snapshot.up:
        return 503, _TEXT, b"the database did not answer; dislockctl serve logged why\n"
    key = next((found for found in snapshot.keys if found.lock_key == lock_key), None)
    if key is None:
        return 404, _TEXT, b"no such lock key\n"
    runs = reader.runs_of(lock_key, KEY_RUNS)
    if runs is None:
        return 503, _TEXT, b"the database did not answer; dislockctl serve logged why\n"
    snapshot = reader.with_strips(snapshot, [lock_key])
    return 200, _HTML, render_key_page(snapshot, key, runs, audit_lines(reader, lock_key)).encode()


def audit_lines(reader: FleetReader, lock_key: str) -> list[str] | str:
    """The audit trail's newest ``KEY_RUNS`` lines about ``lock_key`` (when, who, as
    whom, what and why), newest first, as plain text; or why there are none."""
    found = reader.audit_of(lock_key, KEY_RUNS)
    return found if isinstance(found, str) else [entry_line(entry) for entry in found]


def _runs_table(key: KeyStatus, runs: Sequence[Run], snapshot: FleetSnapshot) -> str:
    if not runs:
        return "<p><small>no run recorded</small></p>"
    envelope = key.last_run.envelope if key.last_run else None
    rows = []
    for run in runs:
        outcome = _badge(run.outcome)
        if run.exit_code is not None and run.outcome != "ok":
            outcome += f" <small>exit {run.exit_code}</small>"
        marked = mark(envelope, run.outcome, run.duration_seconds)
        if marked:
            outcome += f' <span class="badge envelope">{escape(marked)}</span>'
        took = "-" if run.duration_seconds is None else format_duration(run.duration_seconds)
        slot = "-"
        if run.slot_end is not None:
            slot = f"{run.slot_end.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC"
        rows.append(
            f'<tr data-run="{run.id}" data-outcome="{_clip(run.outcome)}">'
            f"<td>{_when(run.started_at, snapshot.now)}</td>"
            f"<td>{_clip(run.host)}<br><small>{_clip(run.owner)}</small></td>"
            f"<td>{_clip(run.modes)}<br><small>slot ends {escape(slot)}</small></td>"
            f'<td>{outcome}</td><td class="num">{escape(took)}</td></tr>'
        )
    return (
        '<table id="runs"><thead><tr><th>started</th><th>where</th><th>lock</th>'
        "<th>outcome</th><th>duration</th></tr></thead>\n<tbody>\n"
        + "\n".join(rows)
        + "\n</tbody></table>"
    )


def render_key_page(
    snapshot: FleetSnapshot, key: KeyStatus, runs: Sequence[Run], audit: Sequence[str] | str
) -> str:
    """The page of ``key``: its row, its newest ``runs`` and the ``audit`` lines (or why
    there are none)."""
    name = _clip(key.lock_key, 2 * SHOWN_CHARS)
    strip, states = key_strip(snapshot, key.lock_key)
    row = _row(key, snapshot.now, strip, pages="")
    if isinstance(audit, str) or not audit:
        why = audit if isinstance(audit, str) else "no audited action"
        trail = f'<p id="audit"><small>{escape(why)}</small></p>'
    else:
        trail = '<ul id="audit">' + "".join(f"<li>{_clip(line, 512)}</li>" for line in audit)
        trail += "</ul>"
    trail = f"<h2>audit trail (the newest {KEY_RUNS})</h2>{trail}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{REFRESH_SECONDS}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{name}: dislock</title><style>{_STYLE}{strip_style(states)}</style></head>
<body><p class="meta"><a href="../">all keys</a></p><h1>{name}</h1>{legend(states)}
<table id="keys">{keys_head()}
<tbody>
{row}
</tbody></table>
<h2>runs (the newest {KEY_RUNS})</h2>
{_runs_table(key, runs, snapshot)}{trail}</body></html>
"""
