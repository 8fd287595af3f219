"""dislock-cli: the ``dislock`` wrapper (``dislock.cli.wrapper.command``) and the operator
tool ``dislockctl`` (``dislock.cli.ctl``), with what both exit with."""

from __future__ import annotations

from dislock.cli.quick_psycopg import prime

prime()  # before anything of dislock's imports psycopg

__version__ = "0.2.0"

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
