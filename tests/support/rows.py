"""Direct access to lock rows, as an operator or another process would have it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql


def released_owner(value: str) -> str | None:
    """The owner of a row its owner released cleanly (``RELEASED_MARK``), else None."""
    from dislock.core.rows import RELEASED_MARK

    return value.removesuffix(RELEASED_MARK) if value.endswith(RELEASED_MARK) else None


def history_runs(
    db: psycopg.Connection[Any], table: tuple[str, ...], key: str
) -> list[dict[str, Any]]:
    """The rows of run history ``table`` for ``key``, oldest first, each with
    ``ordered``: whether it ended no earlier than it started."""
    cursor = db.execute(
        sql.SQL(
            "SELECT *, ended_at >= started_at AS ordered FROM {} WHERE lock_key = %s ORDER BY id"
        ).format(sql.Identifier(*table)),
        (key,),
    )
    names = [column.name for column in cursor.description or []]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


@dataclass(frozen=True)
class Row:
    value: str
    expire_at: datetime
    expired: bool


class Rows:
    """Reads and tampers with lock rows directly, as another process could."""

    def __init__(self, db: psycopg.Connection[Any], table: tuple[str, ...]) -> None:
        self.db = db
        self.table = sql.Identifier(*table)

    def get(self, key: str) -> Row | None:
        found = self.db.execute(
            sql.SQL("SELECT value, expire_at, expire_at <= NOW() FROM {} WHERE key = %s").format(
                self.table
            ),
            (key,),
        ).fetchone()
        return None if found is None else Row(*found)

    def steal(self, key: str, thief: str = "thief", seconds: float = 3600) -> None:
        """Take the row over as another owner would after it expired."""
        self.db.execute(
            sql.SQL(
                "UPDATE {} SET value = %s, expire_at = NOW() + make_interval(secs => %s)"
                " WHERE key = %s"
            ).format(self.table),
            (thief, seconds, key),
        )

    def expire(self, key: str) -> None:
        """Make the row's time run out, as the end of its slot or TTL would."""
        self.db.execute(
            sql.SQL("UPDATE {} SET expire_at = NOW() - interval '1 second' WHERE key = %s").format(
                self.table
            ),
            (key,),
        )

    def now(self) -> datetime:
        row = self.db.execute("SELECT NOW()").fetchone()
        assert row is not None
        value: datetime = row[0]
        return value

    def plant(self, key: str, owner: str, seconds: float) -> None:
        """A row another holder wrote and then left behind (crashed): it expires in
        ``seconds`` and nothing renews or releases it."""
        self.db.execute(
            sql.SQL(
                "INSERT INTO {} (key, value, expire_at)"
                " VALUES (%s, %s, NOW() + make_interval(secs => %s))"
            ).format(self.table),
            (key, owner, seconds),
        )
