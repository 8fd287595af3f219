"""A lock table's grants read back from PostgreSQL's catalog: which roles have which
keys (``dislockctl grants``), whether row-level security is on, where the table
lives, and what would let a granted role around its policies."""

from __future__ import annotations

import json
from collections.abc import Sequence

from dislock.core.grants import OPERATOR, POLICY_PREFIX, Grant


def qualified_query() -> str:
    """``(schema, name)`` of a table (parameter: its name as text, as the search path
    finds it): the function the policies call is created beside it, under a name
    that does not depend on the search path."""
    return (
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.oid = to_regclass(%s)"
    )


def loopholes_query() -> str:
    """What would let a granted role around its policies (parameters: role, table as
    text, role again): table-wide ``UPDATE``, ``TRUNCATE``, ``TRIGGER`` or
    ``REFERENCES`` (``LOCK TABLE``, emptying the table, code run in others'
    sessions), ``DELETE``, and membership in the owner's role (``SET ROLE``) or
    ``BYPASSRLS``, held through ``PUBLIC`` or a role it belongs to after its own
    grant was replaced."""
    return (
        "SELECT array_remove(ARRAY["
        " CASE WHEN has_table_privilege(%(role)s, %(table)s, 'UPDATE') THEN 'UPDATE' END,"
        " CASE WHEN has_table_privilege(%(role)s, %(table)s, 'TRUNCATE') THEN 'TRUNCATE' END,"
        " CASE WHEN has_table_privilege(%(role)s, %(table)s, 'TRIGGER') THEN 'TRIGGER' END,"
        " CASE WHEN has_table_privilege(%(role)s, %(table)s, 'REFERENCES') THEN 'REFERENCES' END,"
        " CASE WHEN has_table_privilege(%(role)s, %(table)s, 'DELETE') THEN 'DELETE' END,"
        " CASE WHEN pg_has_role(%(role)s, c.relowner, 'MEMBER') THEN 'membership in the owner' END,"
        " CASE WHEN r.rolbypassrls OR r.rolsuper THEN 'BYPASSRLS' END], NULL)"
        " FROM pg_class c, pg_roles r WHERE c.oid = to_regclass(%(table)s) AND r.rolname = %(role)s"
    )


def loopholes(access: str, found: Sequence[str]) -> list[str]:
    """The entries of ``loopholes_query``'s answer that undo ``access`` (an operator
    holds ``DELETE`` on purpose)."""
    return [what for what in found if not (access == OPERATOR and what == "DELETE")]


def grants_query() -> str:
    """The dislock grants on a table (parameter: its name as ``regclass`` text): each
    role's read policy and the comment that holds its access and patterns."""
    return (
        "SELECT p.polname, d.description FROM pg_policy p"
        " LEFT JOIN pg_description d ON d.classoid = 'pg_policy'::regclass AND d.objoid = p.oid"
        " WHERE p.polrelid = to_regclass(%s) AND p.polname LIKE 'dislock:%%:read'"
        " ORDER BY p.polname"
    )


def parse_grant(policy: str, comment: str | None) -> Grant | None:
    """A row of ``grants_query`` as a grant (None for a policy it cannot read)."""
    role = policy[len(POLICY_PREFIX) : -len(":read")]
    try:
        described = json.loads(comment or "")
        return Grant(role, str(described["access"]), tuple(map(str, described["keys"])))
    except (ValueError, KeyError, TypeError):
        return None


def security_query() -> str:
    """Whether row-level security is on for a table (parameter: its name as text)."""
    return "SELECT relrowsecurity FROM pg_class WHERE oid = to_regclass(%s)"
