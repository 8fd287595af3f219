"""``dislockctl``: look at, create and repair what the ``dislock`` wrapper relies on.  Here its
command line and what every command shares (the URL variable, ``LOCK_TABLE`` or ``--table``,
``LOCK_HISTORY_TABLE`` or ``--history-table``); the rest is the command's module's
(``dislock.cli.commands``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from dislock.cli import EXIT_OK, EXIT_USAGE, __version__, exit_now
from dislock.cli.commands import COMMANDS, canonical, load


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line and exit 2, like the wrapper
        from dislock.core.bounds import escape  # argparse quotes stray arguments as they are

        self.exit(EXIT_USAGE, f"dislockctl: error: {escape(message)}\n")


_TABLE_HELP = "lock table, 'table' or 'schema.table' (default: $LOCK_TABLE or key_value)"


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The command line, with the arguments of the ``chosen`` command only (the others
    are listed, not imported); without one, it finds which command was asked for."""
    parser = _Parser(
        prog="dislockctl",
        description="Operator commands for dislock's lock table.",
        epilog="Exit status: 0 done, 1 database failure (also: release/resume of a key with "
        "nothing to act on, missed slots found by missed), 2 bad usage or configuration.",
    )
    parser.add_argument("--version", action="version", version=f"dislockctl {__version__}")
    parser.add_argument(
        "url_variable",
        metavar="URL_VARIABLE",
        help="NAME of the environment variable holding the database URL (e.g. DATABASE_URL)",
    )
    parser.add_argument("--table", help=_TABLE_HELP)
    # Accepted after the command too (`dislockctl DATABASE_URL ls --table ops.locks`).
    table = _Parser(add_help=False)
    table.add_argument("--table", default=argparse.SUPPRESS, help=_TABLE_HELP)
    history_table = _Parser(add_help=False)
    history_table.add_argument(
        "--history-table",
        help="run history table (default: $LOCK_HISTORY_TABLE or <lock table>_history)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        parents = [table, history_table] if command.history_table else [table]
        sub = commands.add_parser(
            name,
            aliases=list(command.aliases),
            parents=parents,
            help=command.help,
            add_help=name == chosen,
        )
        if name == chosen:
            load(name).add_arguments(sub)
    return parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    try:
        return _main(argv, environ)
    except BrokenPipeError:
        # `dislockctl ... ls | head`: the reader left; that is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _main(argv: Sequence[str] | None, environ: Mapping[str, str] | None) -> int:
    # The command asked for (``ls`` for ``status``), then its own arguments; ``--help``
    # and mistakes end the process (exit 0 and 2).
    command = canonical(build_parser().parse_known_args(argv)[0].command)
    args = build_parser(command).parse_args(argv)
    env = os.environ if environ is None else environ

    from dislock.cli.commands._call import Call, error
    from dislock.cli.wrapper.settings import read_database_url, read_table
    from dislock.core import variables
    from dislock.core.bounds import MAX_KEY_BYTES, check_reason, check_size, check_utf8
    from dislock.core.errors import ConfigurationError

    if args.table is not None:
        env = {**env, variables.TABLE.name: args.table}  # one source of truth for every command
    if getattr(args, "history_table", None) is not None:
        env = {**env, variables.HISTORY_TABLE.name: args.history_table}
    try:
        url = read_database_url(args.url_variable, env)
        table = read_table(env)
        shown = {"lock_key": variables.KEY.name, "prefix": "PREFIX"}
        for name in ("lock_key", "prefix", "owner", "reason"):
            if (value := getattr(args, name, None)) is not None:
                check_utf8(shown.get(name, f"--{name}"), value)
        if getattr(args, "reason", None) is not None:  # recorded in the audit trail
            check_reason("--reason", args.reason)
        if getattr(args, "lock_key", None) is not None:
            # No wrapper takes a longer key: pausing or rerunning one would act on nothing.
            # Control characters stay allowed, for rows another version (or a hand) wrote.
            check_size(variables.KEY.name, args.lock_key, MAX_KEY_BYTES)
        # A command checks its own input before it connects: a mistake is exit 2.
        return load(command).run(Call(command, args, env, url, table))
    except ConfigurationError as exc:
        error(str(exc))
        return EXIT_USAGE


def console_main() -> NoReturn:
    """The ``dislockctl`` console script: :func:`main`, then ``dislock.cli.exit_now``."""
    exit_now(main())


if __name__ == "__main__":
    console_main()
