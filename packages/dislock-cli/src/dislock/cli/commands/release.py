"""``dislockctl release``: force-expire a stuck schedule slot or lease (one slot of
an N-holder lease with ``--slot``, only while a given owner holds it with
``--owner``), saying what it removed."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dislock.cli import EXIT_OK
from dislock.cli.commands._call import Call, add_reason_argument, audit, no_row
from dislock.core.kinds import NAMES as MODES

if TYPE_CHECKING:
    from dislock.cli.sending import Connection


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lock_key", metavar="LOCK_KEY")
    parser.add_argument("--mode", choices=(*MODES, "all"), default="all")
    parser.add_argument(
        "--owner", help="release only if this owner token still holds it (as shown by ls)"
    )
    parser.add_argument(
        "--slot",
        type=_slot_number,
        help="release only this slot of an N-holder lease (default: every slot)",
    )
    add_reason_argument(parser)


def _slot_number(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a slot number (1, 2, ...), got {text!r}")
    return int(text)


def run(call: Call) -> int:
    return call.connected(lambda conn: _release(conn, call), audited=True)


def _release(conn: Connection, call: Call) -> int:
    from dislock.cli.admin import format_duration
    from dislock.cli.lock_rows import forced_release, release_keys, states
    from dislock.cli.sending import send
    from dislock.core.bounds import clip, escape
    from dislock.core.kinds import kind, parse_row_key

    table, lock_key, owner, slot = call.table, call.args.lock_key, call.args.owner, call.args.slot
    mode = call.args.mode
    modes = (
        ("lease",) if slot is not None and mode == "all" else MODES if mode == "all" else (mode,)
    )
    released = send(conn, forced_release(table, lock_key, modes, slot=slot, owner=owner))
    if not released:
        if not send(conn, states(table, release_keys(lock_key, modes, slot))):
            return no_row(conn, table, lock_key, modes)
        held_by = f" by {escape(owner)}" if owner else ""
        which = f"slot {slot} of the lease" if slot is not None else " or ".join(modes)
        print(f"nothing to release: no {which} lock on {lock_key!r} is held{held_by}")
        return EXIT_OK
    audit(conn, call, "release", lock_key, f"{len(released)} row(s)")
    for row in released:
        found, _, number = parse_row_key(row.key)
        what = "?" if found is None else found.name
        label = f"{what} slot {number}" if number > 1 or slot is not None else what
        print(
            f"released {label} {lock_key!r} held by {clip(row.owner)} "
            f"({format_duration(row.seconds_left)} were left); {kind(what).released_text}"
        )
    return EXIT_OK
