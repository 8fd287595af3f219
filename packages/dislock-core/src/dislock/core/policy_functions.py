"""The functions beside a granted lock table that its row-level security policies call
(``sql/policy_functions.sql``), and the names of every function beside a table.

Setting a policy's condition up costs a catalog lookup and a permission check for
each function call in it, for each execution of a statement and each row check it
applies to (docs/security.md), so the policies (``dislock.core.grant_policies``) are
written with as few calls as will do, and what they rarely need sits behind one call
to ``<table>_dislock_noting``; the table's maximum TTL is ``<table>_dislock_max_ttl()``,
which the planner folds into a constant.
"""

from __future__ import annotations

from psycopg import sql

from dislock.core.failover import TIMELINE, TIMELINE_KEY, TTL_RECORD

MAX_NAME = 63  # PostgreSQL truncates longer identifiers (NAMEDATALEN - 1)

PINNED = sql.SQL("SET search_path = pg_catalog, pg_temp")


def beside(table_parts: tuple[str, ...], suffix: str) -> sql.Identifier:
    return sql.Identifier(*beside_parts(table_parts, suffix))


def beside_parts(table_parts: tuple[str, ...], suffix: str) -> tuple[str, ...]:
    """The name of a function beside the table (its schema, and its name cut so that
    the suffix fits), as parts."""
    *schema, name = table_parts
    return (*schema, f"{name[: MAX_NAME - len(suffix)]}{suffix}")


def template(name: str) -> str:
    """The text of the file ``sql/<name>``."""
    from importlib import resources  # (a package of five modules: only installers read)

    return (resources.files("dislock.core") / "sql" / name).read_text()


def max_ttl_function(table_parts: tuple[str, ...]) -> sql.Identifier:
    """The table's maximum lease TTL, as an interval (folded by the planner)."""
    return beside(table_parts, "_dislock_max_ttl")


def noting_function(table_parts: tuple[str, ...]) -> sql.Identifier:
    """Whether a granted role may write a row it rarely writes."""
    return beside(table_parts, "_dislock_noting")


def policy_functions(table_parts: tuple[str, ...], max_ttl: float) -> list[sql.Composed]:
    """The functions (re)written with a table's first grant and by ``dislockctl init
    --max-ttl``: the maximum is a literal in each (a policy cannot read the table)."""
    return [
        sql.SQL(template("policy_functions.sql")).format(
            max_ttl=max_ttl_function(table_parts),
            max_ttl_body=sql.Literal(f"SELECT interval '{float(max_ttl)!r} seconds'"),
            noting=noting_function(table_parts),
            cap=sql.Literal(float(max_ttl)),
            timeline_key=sql.Literal(TIMELINE_KEY),
            timeline=TIMELINE,
            record=TTL_RECORD,
            former_floor=beside(table_parts, "_dislock_delay"),
        )
    ]
