"""What a grant costs: the same login role on a lock table with and without row-level security.

The floor is the same role on ``bench_plain.key_value`` (the broad grant, no
row-level security); ``bench_secured.key_value`` is granted through
``dislockctl grant --keys 'bench-*'``.  Both a whole CLI run and warm cycles.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg

from benchmarks.cycle import alternating_sync_cycles
from benchmarks.installs import installed_dislock
from benchmarks.rows import Row, met
from benchmarks.server import create_lock_table
from benchmarks.timing import ROUNDS, interleaved, median_ms
from benchmarks.wrapper import wrapper_env


@contextmanager
def granted_tables(url: str) -> Iterator[str]:
    """One login role with a lock table of each kind: ``bench_plain.key_value`` on the
    broad grant (no row-level security), ``bench_secured.key_value`` through
    ``dislockctl grant --keys 'bench-*'``.  Yields the role's URL."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from dislock.core.grant_policies import grant_statements
    from dislock.core.grants import WRAPPER

    role = "bench_wrapper"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("DROP SCHEMA IF EXISTS bench_plain, bench_secured CASCADE")
        if admin.execute("SELECT FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
            admin.execute(f"CREATE ROLE {role} LOGIN")
        for schema in ("bench_plain", "bench_secured"):
            admin.execute(f"CREATE SCHEMA {schema}")
            create_lock_table(admin, (schema, "key_value"))
            admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        admin.execute(f"GRANT SELECT, INSERT, UPDATE ON bench_plain.key_value TO {role}")
        with admin.transaction():
            for statement in grant_statements(
                ("bench_secured", "key_value"),
                role,
                WRAPPER,
                ["bench-*"],
                max_ttl=3600,
                fencing=False,
                history=None,
            ):
                admin.execute(statement)
    params = conninfo_to_dict(url)
    params["user"] = role
    try:
        yield make_conninfo("", **params)
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("DROP SCHEMA bench_plain, bench_secured CASCADE")
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


def roles_rows(url: str, repeat: int, cycles: int) -> list[Row]:
    rows = []
    with granted_tables(url) as role_url, installed_dislock() as (command, how):
        tables = {"plain": "bench_plain.key_value", "secured": "bench_secured.key_value"}

        def env(table: str) -> Callable[[], dict[str, str]]:
            return lambda: {**wrapper_env(role_url, "lease"), "LOCK_TABLE": table}

        samples = interleaved(
            {name: ([str(command), "DATABASE_URL", "true"], env(t)) for name, t in tables.items()},
            repeat,
        )
        plain, secured = median_ms(samples["plain"]), median_ms(samples["secured"])
        rows.append(
            Row(
                f"CLI `dislock URL true`, lease, as a granted role ({how}): with / without grants",
                "{ratio:.2f} ({with_ms:.0f} ms / {without_ms:.0f} ms)",
                "≤ 1.05",
                met(secured / plain <= 1.05),
                {"ratio": secured / plain, "with_ms": secured, "without_ms": plain},
            )
        )
        per_cycle = alternating_sync_cycles(
            role_url, tables, blocks=ROUNDS * 6, block=max(1, cycles // 6)
        )
        plain, secured = per_cycle["plain"] * 1000, per_cycle["secured"] * 1000
        rows.append(
            Row(
                "warm sync lease cycle, as a granted role: with / without grants",
                "{ratio:.2f} ({with_ms:.2f} ms / {without_ms:.2f} ms)",
                "≤ 1.05",
                met(secured / plain <= 1.05),
                {"ratio": secured / plain, "with_ms": secured, "without_ms": plain},
            )
        )
    return rows
