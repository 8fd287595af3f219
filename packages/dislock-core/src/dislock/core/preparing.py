"""When a shared connection may keep its statements prepared on the server: once it
has served a few statements and shows that it reaches the server directly, not
through a pooler that would hand its transactions to other server sessions
(docs/design.md, "PostgreSQL details", says why).
"""

from __future__ import annotations

from psycopg import errors, sql

from dislock.core.exchange import Exchange, read_value

CHECK_AFTER = 8
"""Statements a connection serves before it is checked: more than a one-shot run of
the wrapper sends (acquisitions, releases and history writes), so that a run that
ends soon never pays for the check."""

PREPARE_THRESHOLD = 2
"""psycopg's ``prepare_threshold`` once the connection is known to be direct: a
statement is prepared on its third execution (preparing costs one extra round trip,
once per statement and connection)."""

PREPARED_STATEMENT_ERRORS = (errors.InvalidSqlStatementName, errors.DuplicatePreparedStatement)
"""What the server answers when the session a statement was prepared in is not
the one it reaches (SQLSTATE 26000, 42P05): it refused the statement before running
it, so the statement can be sent again unprepared."""


SERVER_PID: Exchange[object] = Exchange(sql.SQL("SELECT pg_backend_pid() AS pid"), {}, read_value)
"""The server's own process id for this session (checked by ``prepare_threshold``)."""


class Preparation:
    """The preparation decision of one connection: counts its statements and says
    when to check it.  Shared by threads without a lock: a statement counted twice
    or once too few only moves the check by one, and checking twice is harmless."""

    def __init__(self) -> None:
        self.statements = 0
        self.checked = False

    def check_due(self) -> bool:
        """Count a statement; whether the connection is to be checked now (once)."""
        self.statements += 1
        if self.checked or self.statements < CHECK_AFTER:
            return False
        self.checked = True
        return True


def prepare_threshold(announced_pid: int, server_pid: object) -> int | None:
    """psycopg's ``prepare_threshold`` for a connection whose startup announced
    ``announced_pid`` and whose server says ``server_pid`` (``SERVER_PID``): None
    (never prepare) unless they are the same process, i.e. no pooler is in between."""
    direct = isinstance(server_pid, int) and not isinstance(server_pid, bool)
    return PREPARE_THRESHOLD if direct and server_pid == announced_pid else None
