"""The status page's slot strip as HTML: one cell per slot (``slot_strip``), told apart
by colour and by a glyph (never colour alone), named for assistive technology by its
title (slot time and state), with beneath it a bar of the slot's run's duration
against the key's runtime envelope.  Small: a page of 500 keys shows 15,000 cells.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime, timezone
from html import escape
from typing import TYPE_CHECKING

from dislock.cli.admin import format_duration
from dislock.cli.runs.envelope import Envelope
from dislock.cli.runs.missed_slots import FAILED
from dislock.cli.serve.slot_strip import STRIP_SLOTS, StripCell, strip_cells

if TYPE_CHECKING:
    from dislock.cli.serve.fleet_status import FleetSnapshot

GLYPHS = {
    "done": ("\u2713", "#16a34a", "ok"),
    "running": ("\u25b6", "#2563eb", "running"),
    "retrying": ("\u21bb", "#2563eb", "retrying"),
    "failed": ("\u2715", "#dc2626", "failed"),
    "timed_out": ("\u25f4", "#b91c1c", "timed out"),
    "lease_lost": ("\u2298", "#dc2626", "lease lost"),
    "killed": ("\u2715", "#7f1d1d", "killed"),
    "abandoned": ("?", "#dc2626", "abandoned"),
    "held_back": ("\u22ef", "#d97706", "held back"),
    "late": ("!", "#ea580c", "late"),
    "paused": ("\u2016", "#7c3aed", "paused"),
    "covered": ("\u2212", "#93c5fd", "covered"),
    "missed": ("\u25cb", "#fff", "missed"),
}
"""Each state's glyph, colour and words (``slot_strip.StripCell.state``)."""

_STYLE = (
    ".strip{display:inline-flex;gap:1px;align-items:flex-end;position:relative;"
    "border-bottom:1px solid #ccc}tr.with-strip>td{border-bottom:0}"
    "tr.with-strip>td.key{border-bottom:1px solid #e3e6eb}tr.strip-row>td{padding-top:0}"
    ".strip i,.legend i{display:inline-block;width:15px;font:normal bold 10px/15px sans-serif;"
    "text-align:center;color:#fff;position:relative}.strip i{padding-bottom:16px}"
    "i[class^=s-]:before{display:block;height:15px;border-radius:2px;background:var(--c)}"
    ".strip i:after{content:'';position:absolute;left:2px;right:2px;bottom:0;"
    "height:calc(var(--h,0)*15px);background:#64748b}"
    ".strip i.slow:after{background:#d97706}.strip i.short:after{background:#0891b2}"
    ".env{position:absolute;left:0;right:0;border-top:1px dashed #d97706}"
    "i.s-missed{color:#6b7280}i.s-missed:before{box-shadow:inset 0 0 0 1px #9ca3af}"
    "i.s-covered{color:#1e3a8a}.legend i{margin:0 .2em 0 .5em;vertical-align:middle}"
)


def strip_style(states: Collection[str]) -> str:
    """The strip's style sheet, with the glyph and colour of each of ``states`` (those
    on the page): a page of a few keys stays small."""
    return _STYLE + "".join(
        f".s-{state}{{--c:{colour}}}.s-{state}:before{{content:'{glyph}'}}"
        for state, (glyph, colour, _) in GLYPHS.items()
        if state in states
    )


def _slot_time(slot_start: datetime, now: datetime) -> str:
    start = slot_start.astimezone(timezone.utc)
    shown = "%H:%M:%S" if start.second else "%H:%M"
    if start.date() != now.astimezone(timezone.utc).date():
        shown = "%Y-%m-%d " + shown
    return start.strftime(shown)


def strip_html(cells: Sequence[StripCell], envelope: Envelope | None, now: datetime) -> str:
    """The strip of ``cells`` (oldest first); bars are a run's duration over the
    envelope's slow threshold (full height: slow), else over the strip's longest."""
    if not cells:
        return ""
    known = [cell.seconds for cell in cells if cell.seconds is not None]
    scale = envelope.slow_after if envelope is not None else max(known, default=0.0)
    parts = []
    for cell in cells:
        state = cell.state if cell.state in GLYPHS else FAILED
        words = GLYPHS[state][2]
        title = f"{_slot_time(cell.slot.start, now)} {words}"
        classes = f"s-{state}"
        height = ""
        if cell.seconds is not None:
            title += f", {format_duration(cell.seconds)}"
            if cell.mark:
                title += f" ({cell.mark})"
                classes += f" {cell.mark}"
            if scale > 0:
                height = f' style="--h:{min(1.0, cell.seconds / scale):.2f}"'
        parts.append(f'<i role="img" class="{classes}" title="{escape(title)}"{height}></i>')
    line = ""
    if envelope is not None and scale > 0:
        # The usual duration (the envelope's median), on the bars' scale.
        level = 1 + 15 * min(1.0, envelope.median / scale)
        line = f'<b class="env" style="bottom:{level:.1f}px"></b>'
    label = f"the last {len(cells)} slots, oldest first (times UTC)"
    return f'<div class="strip" role="group" aria-label="{label}">{"".join(parts)}{line}</div>'


def legend(states: Collection[str]) -> str:
    """One line naming the glyph of each of ``states``, above the table (none: nothing)."""
    if not states:
        return ""
    shown = "".join(
        f'<i class="s-{state}"></i>{words}'
        for state, (_, _, words) in GLYPHS.items()
        if state in states
    )
    return (
        f'<p class="legend meta">last {STRIP_SLOTS} slots: {shown}. Beneath a slot, its run\'s'
        " duration (full height: slow; dashed: the usual)</p>"
    )


def key_strip(snapshot: FleetSnapshot, lock_key: str) -> tuple[str, set[str]]:
    """The strip of ``lock_key``'s row and the states in it: none without a schedule
    whose slots are counted."""
    source = snapshot.strips.get(lock_key)
    if source is None:
        return "", set()
    cells = strip_cells(source, snapshot.now)
    shown = strip_html(cells, source.envelope, snapshot.now)
    return shown, {cell.state if cell.state in GLYPHS else FAILED for cell in cells}
