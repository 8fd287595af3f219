"""``dislockctl``'s commands, one module each, named by ``COMMANDS``: ``add_arguments``
and ``run`` (``Module``).  Only the chosen command's module is imported, and its own
imports (psycopg among them) wait until it runs, so that one command costs the
others' start-up nothing.
"""

from __future__ import annotations

import argparse
import importlib
from typing import NamedTuple, Protocol

from dislock.cli.commands._call import Call


class Command(NamedTuple):
    help: str
    aliases: tuple[str, ...] = ()
    history_table: bool = False
    """Whether it takes ``--history-table`` (and so reads ``LOCK_HISTORY_TABLE``)."""


class Module(Protocol):
    """What a command's module provides."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, call: Call) -> int: ...


COMMANDS: dict[str, Command] = {
    "init": Command("create the lock table (and schema) if missing"),
    "ls": Command(
        "list locks: held, released, expired (abandoned), ended slots, paused", ("status",)
    ),
    "release": Command("force-expire a stuck schedule slot or lease, saying what it removed"),
    "pause": Command(
        "stop every machine from starting LOCK_KEY (they skip it) until resumed",
        history_table=True,
    ),
    "resume": Command("end a pause of LOCK_KEY", history_table=True),
    "rerun": Command(
        "open LOCK_KEY's current schedule slot for one more run, by the next wrapper to start",
        history_table=True,
    ),
    "retire": Command(
        "take LOCK_KEY off ls, missed and serve: delete its rows and run history (audited)",
        history_table=True,
    ),
    "audit": Command("who did which operator action, when and why (oldest first)"),
    "history": Command(
        "recorded runs, newest first: where, how long, outcome (init --history)",
        history_table=True,
    ),
    "missed": Command(
        "what became of each slot of LOCK_KEY's schedule; exit 1 if one was missed, late or failed",
        history_table=True,
    ),
    "check": Command(
        "validate the wrapper's environment and show what it would do, acquiring nothing"
    ),
    "serve": Command(
        "serve Prometheus metrics (/metrics) and a status page (/), read-only",
        history_table=True,
    ),
    "grant": Command(
        "let ROLE lock the keys PATTERN matches, and nothing else (row-level security)",
        history_table=True,
    ),
    "revoke": Command("take ROLE's grant away", history_table=True),
    "grants": Command(
        "which role may lock which keys, the maximum TTL; exit 1 on a privilege given by hand",
        history_table=True,
    ),
    "fence": Command(
        "make a table of yours refuse every write not carrying the token of LOCK_KEY's live lease"
    ),
    "unfence": Command("take fence's guard off a table"),
}
"""Every command, in the order ``--help`` lists them."""


def canonical(name: str) -> str:
    """The command an alias names (``status`` is ``ls``)."""
    for command, entry in COMMANDS.items():
        if name == command or name in entry.aliases:
            return command
    raise KeyError(name)


def load(command: str) -> Module:
    """The module of ``command`` (a key of ``COMMANDS``)."""
    module: Module = importlib.import_module(f"dislock.cli.commands.{command}")
    return module
