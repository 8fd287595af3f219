"""``dislockctl release``: force-expire a stuck schedule slot or lease (one slot of
an N-holder lease with ``--slot``, only while a given owner holds it with
``--owner``), saying what it removed."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dislock.cli import EXIT_FAILURE, EXIT_OK
from dislock.cli.commands._call import Call, error
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


def _slot_number(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a slot number (1, 2, ...), got {text!r}")
    return int(text)


def run(call: Call) -> int:
    args = call.args
    return call.connected(
        lambda conn: _release(conn, call.table, args.lock_key, args.mode, args.owner, args.slot)
    )


def _release(
    conn: Connection,
    table: tuple[str, ...],
    lock_key: str,
    mode: str,
    owner: str | None,
    slot: int | None,
) -> int:
    from dislock.cli.admin import format_duration, no_row_text, released_text
    from dislock.cli.lock_rows import forced_release, release_keys, states
    from dislock.cli.row_security import row_security
    from dislock.cli.sending import send
    from dislock.core.bounds import clip, escape
    from dislock.core.kinds import parse_row_key

    modes = (
        ("lease",) if slot is not None and mode == "all" else MODES if mode == "all" else (mode,)
    )
    released = send(conn, forced_release(table, lock_key, modes, slot=slot, owner=owner))
    if not released:
        if not send(conn, states(table, release_keys(lock_key, modes, slot))):
            # A typo is not a success; but row-level security may be hiding the row.
            security = send(conn, row_security(table))
            hidden_from = security.role if security and security.hides(lock_key) else None
            error(no_row_text(lock_key, modes, table, hidden_from=hidden_from))
            return EXIT_FAILURE
        held_by = f" by {escape(owner)}" if owner else ""
        which = f"slot {slot} of the lease" if slot is not None else " or ".join(modes)
        print(f"nothing to release: no {which} lock on {lock_key!r} is held{held_by}")
        return EXIT_OK
    for row in released:
        found, _, number = parse_row_key(row.key)
        what = "?" if found is None else found.name
        label = f"{what} slot {number}" if number > 1 or slot is not None else what
        print(
            f"released {label} {lock_key!r} held by {clip(row.owner)} "
            f"({format_duration(row.seconds_left)} were left); {released_text(what)}"
        )
    return EXIT_OK
