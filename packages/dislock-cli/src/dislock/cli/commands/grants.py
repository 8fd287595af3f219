"""``dislockctl grants``: which role may lock which keys, the table's maximum lease
TTL, and any privilege given by hand that lets a role around the policies of the lock
table, its run history or its audit trail (exit 1)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from dislock.cli import EXIT_FAILURE, EXIT_OK
from dislock.cli.commands._call import Call, columns, error

if TYPE_CHECKING:
    from dislock.cli.sending import Connection


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(call: Call) -> int:
    history = call.history_table()
    return call.connected(lambda conn: _list_grants(conn, call, history))


def _list_grants(conn: Connection, call: Call, history: tuple[str, ...]) -> int:
    import json

    from dislock.cli.commands._granting import key_bound
    from dislock.cli.sending import send
    from dislock.core import grant_catalog
    from dislock.core.audit_trail import audit_table
    from dislock.core.bounds import escape
    from dislock.core.limits import max_ttl

    table = call.table
    if not columns(conn, table):
        return error(f"lock table {'.'.join(table)} does not exist: dislockctl init first")
    secured = send(conn, grant_catalog.secured(table))
    most, recorded = send(conn, max_ttl(table))
    listed = send(conn, grant_catalog.grants_on(table))
    members = _members(conn, [g.role for g in listed])
    holes = [(table, hole) for hole in send(conn, grant_catalog.audit(table))]
    holes += [(history, h) for h in send(conn, grant_catalog.audit(history, history=True))]
    # The audit trail: no policy lets a role write it, so any write privilege is one.
    trail = audit_table(table)
    holes += [(trail, h) for h in send(conn, grant_catalog.audit(trail))]
    status = EXIT_FAILURE if holes else EXIT_OK
    if call.args.json:
        report = {
            "table": ".".join(table),
            "row_level_security": bool(secured),
            "max_ttl_seconds": most,
            "grants": [
                g._asdict() | {"keys": list(g.keys), "members": members.get(g.role, [])}
                for g in listed
            ],
            "loopholes": [
                {"role": h.role, "privileges": list(h.privileges), "table": ".".join(t)}
                for t, h in holes
            ],
        }
        print(json.dumps(report, indent=2))
        return status
    origin = "" if recorded else " (the default)"
    print(f"table {'.'.join(table)}: maximum lease TTL {most:g} s{origin}")
    if not secured:
        print("no grants: every role with privileges on the table may lock every key")
        return EXIT_OK
    if not listed:
        print("row-level security is on and no role has a grant: only the owner locks")
    width = max([len(escape(g.role)) for g in listed] + [4])
    for g in listed:
        keys = ", ".join(escape(p) for p in g.keys) if g.keys else "every key (read only)"
        bound = key_bound(g.access, g.max_keys or 0)
        budget = f", {g.max_history_mib} MiB of history" if g.max_history_mib else ""
        print(f"{escape(g.role):<{width}}  {g.access:<8}  {keys}{bound}{budget}")
        for member in members.get(g.role, ()):
            print(f"{'':<{width}}  member {escape(member)} (locks with this grant)")
    for where, hole in holes:
        print(grant_catalog.describe(hole, where))
    return status


def _members(conn: Connection, roles: list[str]) -> dict[str, list[str]]:
    """The login roles that are members of each granted role: they lock with its
    grant (the lock functions check the login role and the roles it belongs to)."""
    rows = conn.execute(
        "SELECT g.rolname, m.rolname FROM pg_auth_members AS a"
        " JOIN pg_roles AS g ON g.oid = a.roleid JOIN pg_roles AS m ON m.oid = a.member"
        " WHERE g.rolname = ANY(%s) AND m.rolcanlogin ORDER BY 1, 2",
        (roles,),
    ).fetchall()
    found: dict[str, list[str]] = {}
    for role, member in rows:
        found.setdefault(str(role), []).append(str(member))
    return found
