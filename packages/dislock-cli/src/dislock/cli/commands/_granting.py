"""``dislockctl grant`` (and ``init``, which writes old grants again): let a role lock
the keys its patterns match, and nothing else; what ``grants`` and ``revoke`` share.

The decisions are ``dislock.core.grant_policies``'; this module reads the facts they depend
on from the database, runs the statements in one transaction or prints them, and
words the outcome.  Run as the table's owner: only it can create policies.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from psycopg import sql

from dislock.cli import EXIT_OK
from dislock.cli.commands._call import columns, error
from dislock.cli.commands._call import print_sql as print_statements
from dislock.cli.sending import send
from dislock.cli.table_change import TableBusy, change
from dislock.core import grant_catalog, grant_policies, grants
from dislock.core.audit_trail import audit_table
from dislock.core.bounds import escape
from dislock.core.limits import max_ttl

if TYPE_CHECKING:
    from dislock.cli.sending import Connection


def key_bound(access: grants.Access, max_keys: int) -> str:
    """How many keys a role may hold, as the end of its line."""
    if access == grants.READER:
        return ""
    return f" (at most {max_keys} keys)" if max_keys > 0 else " (any number of keys)"


def grant(
    conn: Connection,
    table: tuple[str, ...],
    history: tuple[str, ...],
    role: str,
    access: grants.Access,
    patterns: list[str],
    *,
    print_sql: bool,
    patience: float,
    max_keys: int | None = None,
    plain_writes: bool = False,
    max_history_mib: int | None = None,
    reason: str = "",
) -> int:
    """Give ``role`` ``access`` to the keys ``patterns`` match (replacing its earlier
    grant), at most ``max_keys`` of them (0: no limit; None: ``grants.quota_of``)."""
    found = columns(conn, table)
    if not found:
        return error(f"lock table {'.'.join(table)} does not exist: dislockctl init first")
    if conn.execute("SELECT FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
        return error(
            f"role {escape(role)!r} does not exist; creating login roles stays the DBA's job"
            f" (CREATE ROLE {sql.Identifier(role).as_string(None)} LOGIN PASSWORD …)"
        )
    qualified = _qualified(conn, table)
    history_parts = _qualified(conn, history) if columns(conn, history) else None
    trail = audit_table(qualified)

    def statements(conn: Connection) -> list[sql.Composed]:
        # Read in the transaction that runs them: the maximum TTL they bound leases by.
        most = send(conn, max_ttl(qualified)).seconds
        return grant_policies.grant_statements(
            qualified,
            role,
            access,
            patterns,
            max_ttl=most,
            fencing="fence" in found,
            history=history_parts,
            max_keys=max_keys,
            plain_writes=plain_writes,
            max_history_mib=max_history_mib,
            trail=trail if columns(conn, trail) else None,
        )

    if print_sql:
        return print_statements(statements(conn), transaction=True)
    detail = " ".join([role, access, *patterns])
    try:
        change(
            conn,
            "grant",
            [qualified, *([history_parts] if history_parts else [])],
            lambda conn: _grant(conn, statements(conn), qualified, role, detail, reason),
            patience=patience,
        )
    except (_Refused, TableBusy) as refusal:
        return error(str(refusal))
    what = {
        grants.WRAPPER: "may take",
        grants.OPERATOR: "may take, pause, resume, release and prune",
        grants.READER: "may read",
    }[access]
    keys = ", ".join(escape(p) for p in patterns) if patterns else "every key"
    bound = key_bound(access, grants.quota_of(access, max_keys))
    print(f"role {escape(role)!r} {what} {keys} in {'.'.join(table)}{bound}")
    if send(conn, grant_catalog.exempt(role, table)):
        print(
            f"warning: role {escape(role)!r} owns the table, is a superuser or bypasses"
            " row-level security: the grant does not limit it",
            file=sys.stderr,
        )
    return EXIT_OK


def _grant(
    conn: Connection,
    statements: list[sql.Composed],
    qualified: tuple[str, ...],
    role: str,
    detail: str,
    reason: str,
) -> None:
    """Run the grant's ``statements`` in the transaction ``change`` opened, and audit
    it.  A grant that a privilege held elsewhere would undo raises ``_Refused``, and
    is rolled back."""
    for statement in statements:
        conn.execute(statement)
    audit_grant(conn, qualified, "grant", detail, reason)
    holes = send(conn, grant_catalog.loopholes(role, qualified))
    if holes:
        raise _Refused(
            f"role {escape(role)!r} would still have {', '.join(holes)} on"
            f" {'.'.join(qualified)} (through PUBLIC or a role it belongs to), which no policy"
            " can limit: revoke that first; nothing was granted"
        )


def audit_grant(
    conn: Connection, table: tuple[str, ...], action: str, detail: str, reason: str
) -> None:
    """Record a grant or revoke in the table's audit trail, if it has one, in the
    transaction that made it."""
    from dislock.core import audit_trail

    if send(conn, audit_trail.installed(table)):
        send(conn, audit_trail.record(table, action, None, detail, reason))


class _Refused(Exception):
    """A grant that would not hold: its transaction is rolled back."""


def _qualified(conn: Connection, table: tuple[str, ...]) -> tuple[str, ...]:
    found = send(conn, grant_catalog.qualified(table))
    return table if found is None else found
