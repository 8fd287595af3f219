"""The status page ``dislockctl serve`` shows at ``/``: one HTML document, no assets.

Every value from the database is escaped (a lock key is whatever a crontab said, and
must not become markup) and clipped (``dislock.core.bounds.clip``): a row written
by hand may hold megabytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from html import escape
from urllib.parse import quote

from dislock.cli.admin import format_duration, released_as
from dislock.cli.far_times import far
from dislock.cli.lock_rows import RUNNING, SLOT_TAKEN, WAITING
from dislock.cli.serve.fleet_status import FAILED_OUTCOMES, MISSED_WINDOW, FleetSnapshot, KeyStatus
from dislock.cli.serve.strip_html import key_strip, legend, strip_style
from dislock.cli.shown import was_cut
from dislock.core import bounds
from dislock.core.bounds import MAX_REASON_BYTES, SHOWN_CHARS
from dislock.core.history import OUTCOMES
from dislock.core.pause import UNTIL_RESUMED

REFRESH_SECONDS = 15

_STYLE = (
    """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d2430;background:#f6f7f9}
h1{font-size:1.3em;margin:0 0 .2em}
h2{font-size:1.1em;margin:1.5em 0 .4em}
p.meta{color:#5b6575;margin:0 0 1em}
table{border-collapse:collapse;width:100%;background:#fff;box-shadow:0 1px 2px #0002}
th,td{padding:.45em .7em;text-align:left;border-bottom:1px solid #e3e6eb;vertical-align:top}
td.key{min-width:8em;max-width:16em;overflow-wrap:anywhere}
.when small{white-space:nowrap}
th{background:#eef1f5;font-weight:600;font-size:.9em;color:#3a4456}
td.num{text-align:right;font-variant-numeric:tabular-nums}
small{color:#6b7585}
.badge{display:inline-block;padding:.05em .5em;border-radius:.8em;font-size:.85em;font-weight:600}
.held{background:#dbeafe;color:#1e40af}.slot-taken{background:#e0f2fe;color:#075985}
.waiting-for-group{background:#ede9fe;color:#5b21b6}.released,.ended,.free,.other{background:#e5e7eb;color:#374151}
.expired{background:#fde68a;color:#7c4a03}.paused{background:#ede9fe;color:#5b21b6}
.ok{background:#dcfce7;color:#166534}.running{background:#dbeafe;color:#1e40af}
.late{background:#ffedd5;color:#9a3412}
.envelope{background:#fde68a;color:#7c4a03}
tr.failing td:first-child{box-shadow:inset 4px 0 #dc2626}
.down{background:#fee2e2;color:#991b1b;padding:.8em 1em;border-radius:.3em;margin-bottom:1em}
.delay{background:#fde68a;color:#7c4a03;padding:.8em 1em;border-radius:.3em;margin-bottom:1em}
details.output pre{max-width:60em;max-height:20em;overflow:auto;font-size:.85em;margin:.3em 0;
background:#f3f4f6;padding:.4em;white-space:pre-wrap}
"""
    + (
        # Every outcome the page counts as failing is red, whichever are added later.
        ",".join(f".{outcome}" for outcome in FAILED_OUTCOMES)
        + "{background:#fee2e2;color:#991b1b}"
    )
)


def _when(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "-"
    delta = (now - moment).total_seconds()
    relative = f"{format_duration(delta)} ago" if delta >= 0 else f"in {format_duration(-delta)}"
    stamp = far(moment) or moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        f'<span class="when" title="{escape(stamp)}">{escape(relative)}<br>'
        f"<small>{escape(stamp)}</small></span>"
    )


_BADGES = frozenset(
    ("held", "released", "ended", "free", "expired", "paused", "running", "abandoned", *OUTCOMES)
) | {SLOT_TAKEN, WAITING}
"""The words the style sheet colours."""


def _clip(text: str, limit: int = SHOWN_CHARS) -> str:
    """Text from the database, for the page: clipped, control characters escaped,
    then escaped as HTML."""
    return escape(bounds.clip(text, limit))


def _badge(word: str) -> str:
    kind = word.replace(" ", "-") if word in _BADGES else "other"
    return f'<span class="badge {kind}">{_clip(word.replace("_", " "))}</span>'


def _state_cell(key: KeyStatus) -> str:
    parts = [_badge(key.state)]
    if key.paused_until is not None:
        reason = f": {bounds.clip(key.pause_reason, MAX_REASON_BYTES)}" if key.pause_reason else ""
        until = "until resumed"
        if key.paused_until < UNTIL_RESUMED:
            until = f"until {key.paused_until.astimezone(timezone.utc):%Y-%m-%d %H:%M UTC}"
        parts.append(f"<small>{escape(until)}{escape(reason)}</small>")
    for lock in key.locks:
        owner = lock.owner  # clipped already
        left = format_duration(lock.seconds_left)
        if lock.activity == SLOT_TAKEN:
            detail = f"slot taken by {owner} until it ends, {left} left"
        elif lock.activity == WAITING:
            detail = f"{lock.mode} held by {owner}, waiting for a slot of its group"
        elif lock.state == "held":
            detail = f"{lock.mode} held by {owner}, {left} left"
        elif lock.state == "expired":
            detail = f"{lock.mode} abandoned by {owner} {format_duration(-lock.seconds_left)} ago"
        elif lock.state == "ended":
            detail = f"{lock.mode} slot of {owner} ended"
        elif lock.forced:
            detail = f"{lock.mode} of {owner} released by dislockctl{released_as(lock.released_by)}"
        else:
            detail = f"{lock.mode} released by {owner}"
        parts.append(f"<small>{escape(detail)}</small>")
    return "<br>".join(parts)


def _run_cells(key: KeyStatus, now: datetime) -> str:
    run = key.last_run
    if run is None:
        # Its lock rows are there, its runs are not: its wrappers do not record them
        # (or the history was pruned past its last run).
        return (
            '<td colspan="4" class="none"><small>no run recorded: its wrappers need'
            " LOCK_HISTORY=1 (or its runs were pruned)</small></td>"
        )
    outcome = _badge(run.outcome)
    if run.exit_code is not None and run.outcome != "ok":
        outcome += f" <small>exit {run.exit_code}</small>"
    if run.mark is not None:
        # Its duration against the key's usual ones (dislock.cli.runs.envelope).
        past = "running past its envelope" if run.outcome == "running" else run.mark
        outcome += f' <span class="badge envelope">{escape(past)}</span>'
    if run.output is not None:
        outcome += _output(run.output)
    duration = "-" if run.duration_seconds is None else format_duration(run.duration_seconds)
    where = f"{_clip(run.host)}<br><small>{_clip(run.owner)}</small>"
    return (
        f"<td>{_when(run.started_at, now)}</td><td>{where}</td>"
        f'<td>{outcome}</td><td class="num">{escape(duration)}</td>'
    )


def _output(output: tuple[str | None, str | None]) -> str:
    """The end of a failed run's output, folded: each stream's last lines, escaped."""
    from dislock.cli.runs.history_report import shown_tail

    parts = []
    for name, text in zip(("stdout", "stderr"), output, strict=True):
        if text:
            lines = "\n".join(shown_tail(text)[0])
            parts.append(f"<b>{name}</b>\n{escape(lines)}")
    shown = "\n".join(parts)
    return f'<details class="output"><summary>last output</summary><pre>{shown}</pre></details>'


def _next_cell(key: KeyStatus, now: datetime) -> str:
    schedule = ""
    if key.schedule:
        schedule = f"<br><small><code>{_clip(key.schedule, 2 * SHOWN_CHARS)}</code></small>"
    if key.paused_until is not None:
        # Its slots come and go without a start until it is resumed.
        return f"{_badge('paused')}{schedule}"
    if key.next_slot is None and not key.schedule:
        return "<small>no schedule recorded</small>"
    return f"{_when(key.next_slot, now)}{schedule}"


def _slots_cell(key: KeyStatus) -> str:
    if key.missed_slots is None:
        return "-"
    cell = escape(str(key.missed_slots))
    for count, note in (
        (key.late_slots, "of them late (past the start deadline)"),
        (key.held_back_slots, "of them held back (waiting for LOCK_AFTER's keys)"),
        (key.failed_slots, "failed (every attempt)"),
        (key.paused_slots, "paused"),
        (key.covered_slots, "covered by a run still going"),
    ):
        if count:
            cell += f"<br><small>{escape(f'{count} {note}')}</small>"
    return cell


KEY_PAGES = "key/"
"""Where a key's own page is, relative to the main page (``key_page``)."""


def key_link(lock_key: str, shown: str, pages: str = KEY_PAGES) -> str:
    """``shown`` (HTML) linked to the key's page, its name URL-encoded whole (a ``/`` too)."""
    if was_cut(lock_key):
        return shown  # more than any key holds: no page would find it
    return f'<a href="{escape(pages + quote(lock_key, safe=""))}">{shown}</a>'


def _row(key: KeyStatus, now: datetime, strip: str = "", pages: str = KEY_PAGES) -> str:
    outcome = key.last_run.outcome if key.last_run else ""
    envelope = (key.last_run.mark if key.last_run else None) or ""
    classes = "failing" if key.failing else ""
    # The slot strip, when the key has one, in a row of its own beneath: the key's cell spans both.
    span, beneath = "", ""
    if strip:
        classes = f"{classes} with-strip".strip()
        span, beneath = ' rowspan="2"', f'\n<tr class="strip-row"><td colspan="7">{strip}</td></tr>'
    counts = {"missed": key.missed_slots, "covered": key.covered_slots, "failed": key.failed_slots}
    data = "".join(f' data-{name}="{"-" if n is None else n}"' for name, n in counts.items())
    return (
        # data-key is the whole key (every key dislock takes is at most 2048 bytes),
        # for scripts to find the row by.
        f'<tr class="{classes}" data-key="{escape(bounds.escape(key.lock_key))}"'
        f' data-state="{escape(key.state)}"'
        f' data-outcome="{_clip(outcome)}" data-envelope="{envelope}"{data}>'
        # Wrapped within its column, whole on hover: a long key widened the table off-screen.
        f'<td class="key"{span} title="{escape(bounds.escape(key.lock_key))}">'
        f"<strong>{key_link(key.lock_key, _clip(key.lock_key, 2 * SHOWN_CHARS), pages)}"
        "</strong></td>"
        f"<td>{_state_cell(key)}</td>"
        f"{_run_cells(key, now)}"
        f"<td>{_next_cell(key, now)}</td>"
        f'<td class="num">{_slots_cell(key)}</td>'
        f"</tr>{beneath}"
    )


def keys_head() -> str:
    """The head of the keys' table (the main page's, and a key's own page's)."""
    window = int(MISSED_WINDOW.total_seconds() // 3600)
    return (
        "<thead><tr><th>lock key</th><th>state</th><th>last start</th><th>where</th>"
        f"<th>outcome</th><th>duration</th><th>next slot</th><th>missed ({window} h)</th>"
        "</tr></thead>"
    )


def page_order(keys: Iterable[KeyStatus]) -> list[KeyStatus]:
    """The newest failures first, then keys that missed slots, then the rest by name."""
    keys = list(keys)
    failing = sorted(
        (key for key in keys if key.failing),
        key=lambda key: key.last_run.started_at if key.last_run else datetime.min,
        reverse=True,
    )
    rest = sorted(
        (key for key in keys if not key.failing),
        key=lambda key: (not (key.missed_slots or key.failed_slots), key.lock_key),
    )
    return failing + rest


PAGE_ROWS = 500
"""Keys the page shows at most, in ``page_order`` (failures first)."""

STRIP_ROWS = 50
"""Keys the page shows the slot strip of, the first in ``page_order`` (every key's own
page shows its strip): 30 cells are as many bytes as the rest of a row."""

PAGE_GROUPS = 100
"""Groups the page shows at most, by name."""

SHOWN_HOLDERS = 10
"""Holders of one group the page names at most (the others are counted)."""


def _groups(snapshot: FleetSnapshot) -> str:
    """The table of groups (``LOCK_GROUP``): each group's name, how many of its slots are
    held, and by whom; none: nothing."""
    groups = snapshot.groups
    if not groups:
        return ""
    rows = []
    for group in groups[:PAGE_GROUPS]:
        # The owners are clipped already (``group_statuses``).
        holders = "<br>".join(escape(owner) for owner in group.holders[:SHOWN_HOLDERS])
        if group.held > SHOWN_HOLDERS:
            holders += f"<br><small>and {group.held - SHOWN_HOLDERS} more</small>"
        whole = escape(bounds.escape(group.name))
        rows.append(
            f'<tr data-group="{whole}" data-held="{group.held}">'
            f'<td class="key" title="{whole}"><strong>{_clip(group.name, 2 * SHOWN_CHARS)}'
            f'</strong></td><td class="num">{group.held} held</td><td>{holders or "-"}</td></tr>'
        )
    if len(groups) > PAGE_GROUPS:
        rows.append(
            f'<tr><td colspan="3">{len(groups) - PAGE_GROUPS} more groups not shown'
            " (/metrics has every one)</td></tr>"
        )
    return (
        '\n<h2>groups</h2><table id="groups"><thead><tr><th>group</th><th>slots</th>'
        "<th>held by</th></tr></thead>\n<tbody>\n" + "\n".join(rows) + "\n</tbody></table>"
    )


def render_page(snapshot: FleetSnapshot, *, title: str = "dislock fleet") -> str:
    """The whole page for ``snapshot``; ``title`` is shown as is (escaped)."""
    now = snapshot.now
    keys = page_order(snapshot.keys)
    failing = sum(1 for key in keys if key.failing)
    missing = sum(1 for key in keys if key.missed_slots or key.failed_slots)
    paused = sum(1 for key in keys if key.paused_until is not None)
    running = sum(1 for key in keys if key.state == RUNNING)
    stamp = now.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    window = int(MISSED_WINDOW.total_seconds() // 3600)
    if snapshot.up:
        summary = (
            f"{len(keys)} keys: {running} running, {failing} failing,"
            f" {missing} with missed or failed slots in the last {window} h, {paused} paused."
            f" Database clock {stamp}; reloads every {REFRESH_SECONDS} s."
        )
        banner = ""
    else:
        summary = f"Server clock {stamp}; reloads every {REFRESH_SECONDS} s."
        banner = (
            '<div class="down" id="down">The database did not answer; dislockctl serve logged'
            " why on its standard error (the PostgreSQL server's log may say more). This page"
            " tries again at its next reload.</div>"
        )
    if snapshot.lock_delay_end is not None:
        end = snapshot.lock_delay_end
        left = format_duration((end - now).total_seconds())
        ends = f"{end.astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC, in {left}"
        banner += (
            '<div class="delay" id="lock-delay">Lock delay after a database failover: no lock'
            f" of any key is taken before {escape(ends)}.</div>"
        )
    # Bounded: a team that may write 20,000 keys must not make the page megabytes long.
    strips = [
        key_strip(snapshot, key.lock_key) if index < STRIP_ROWS else ("", set())
        for index, key in enumerate(keys[:PAGE_ROWS])
    ]
    rows = "\n".join(_row(key, now, strip) for key, (strip, _) in zip(keys, strips, strict=False))
    states = set().union(*(found for _, found in strips))
    style, shown = (_STYLE + strip_style(states), legend(states)) if states else (_STYLE, "")
    empty = '<tr><td colspan="8">no lock keys yet</td></tr>' if snapshot.up and not keys else ""
    if len(keys) > PAGE_ROWS:
        empty = (
            f'<tr><td colspan="8">{len(keys) - PAGE_ROWS} more keys not shown'
            " (/metrics has every one)</td></tr>"
        )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{REFRESH_SECONDS}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title><style>{style}</style></head>
<body><h1>{escape(title)}</h1><p class="meta">{escape(summary)}</p>{banner}{shown}
<table id="keys">{keys_head()}
<tbody>
{rows}{empty}
</tbody></table>{_groups(snapshot)}</body></html>
"""
