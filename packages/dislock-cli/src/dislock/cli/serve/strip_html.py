"""The status page's slot strip as HTML: one cell per slot (``slot_strip``), told apart
by colour and by a glyph (never colour alone), named for assistive technology by its
title (slot time and state), with beneath it a bar of the slot's run's duration
against the key's runtime envelope.  Small: a page of 500 keys shows 15,000 cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from html import escape
from typing import TYPE_CHECKING

from dislock.cli.admin import format_duration
from dislock.cli.runs.envelope import Envelope
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
    "missed": ("\u25cb", "#9ca3af", "missed"),
}
"""Each state's glyph, colour and words (``slot_strip.StripCell.state``)."""

STYLE = (
    ".strip{display:inline-flex;gap:1px;align-items:flex-end;position:relative;"
    "padding-bottom:1px;border-bottom:1px solid #d1d5db}"
    "tr.with-strip>td{border-bottom:0}tr.with-strip>td.key{border-bottom:1px solid #e3e6eb}"
    "tr.strip-row>td{padding-top:0}"
    ".strip i{display:inline-block;width:15px;font:bold 10px/15px system-ui,sans-serif;"
    "font-style:normal;text-align:center;color:#fff;position:relative;padding-bottom:16px}"
    ".strip i::before{display:block;height:15px;border-radius:2px;background:var(--c)}"
    ".strip i::after{content:'';position:absolute;left:2px;right:2px;bottom:0;"
    "height:calc(var(--h,0)*15px);background:#64748b}"
    ".strip i.slow::after{background:#d97706}.strip i.short::after{background:#0891b2}"
    ".strip .env{position:absolute;left:0;right:0;border-top:1px dashed #d97706;"
    "pointer-events:none}"
    ".strip i.s-missed::before{background:#fff;color:#6b7280;box-shadow:inset 0 0 0 1px #9ca3af}"
    ".strip i.s-covered::before{color:#1e3a8a}"
    "p.legend i{font-style:normal;font-weight:bold;margin:0 .2em 0 .6em}"
    + "".join(
        f".strip i.s-{state}{{--c:{colour}}}.strip i.s-{state}::before{{content:'{glyph}'}}"
        for state, (glyph, colour, _) in GLYPHS.items()
    )
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
        _, _, words = GLYPHS.get(cell.state, GLYPHS["failed"])
        state = cell.state if cell.state in GLYPHS else "failed"
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


def legend() -> str:
    """One line naming each glyph, above the table."""
    shown = " ".join(
        f'<i style="color:{colour}">{glyph}</i>{escape(words)}'
        for glyph, colour, words in GLYPHS.values()
    )
    return (
        f'<p class="legend meta">last {STRIP_SLOTS} slots: {shown}; the bar beneath a slot is'
        " its run's duration (full height: slow; the dashed line: the usual one)</p>"
    )


def key_strip(snapshot: FleetSnapshot, lock_key: str) -> str:
    """The strip of ``lock_key``'s row: empty without a schedule whose slots are counted."""
    source = snapshot.strips.get(lock_key)
    if source is None:
        return ""
    return strip_html(strip_cells(source, snapshot.now), source.envelope, snapshot.now)
