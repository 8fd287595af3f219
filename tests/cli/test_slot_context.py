"""The wrapper's "since when" (``DISLOCK_SLOT_START``, ``DISLOCK_LAST_SUCCESS``): docs/recipes.md's
incremental export, its crontab line and script run as printed, night after night (a night
is a one-second slot here): the first exports everything, the next what changed since the
first's slot began, and the night after a failed one catches up from the last success."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from tests.cli.conftest import ROOT, dislock_on_path
from tests.support.eventually import eventually

HEADING = "### An incremental export, since the last success"


def recipe() -> tuple[str, str]:
    """The recipe's crontab job line (its command, as cron runs it) and its script."""
    section = (ROOT / "docs/recipes.md").read_text().split(HEADING, 1)[1]
    section = re.split(r"\n#{2,3} ", section, maxsplit=1)[0]
    crontab = re.search(r"```crontab\n(.*?)```", section, re.S)
    script = re.search(r"```python\n(.*?)```", section, re.S)
    assert crontab is not None and script is not None
    (line,) = [line for line in crontab.group(1).splitlines() if re.match(r"[\d*]", line)]
    return line.split(None, 5)[5], script.group(1)


def test_the_recipes_export_catches_up_from_the_last_successful_night(
    history_env: dict[str, str], db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    command, script = recipe()
    exports = tmp_path / "exports"
    exports.mkdir()
    job = tmp_path / "export_orders.py"
    job.write_text(script.replace("/var/exports", str(exports)))
    command = command.removeprefix(". /etc/dislock/jobs.env && ")
    # A night per second (croniter's six fields, seconds last).
    command = command.replace('CRON_SCHEDULE="0 3 * * *"', 'CRON_SCHEDULE="* * * * * *"')
    command = command.replace("python3 /opt/jobs/export_orders.py", f"{sys.executable} {job}")
    schema, table = history_env["LOCK_TABLE"].split(".")
    history = sql.Identifier(schema, f"{table}_history")
    db.execute(
        sql.SQL(
            "CREATE TABLE {}.orders (id int PRIMARY KEY, total numeric, updated_at timestamptz)"
        ).format(sql.Identifier(schema))
    )
    env = {k: v for k, v in history_env.items() if k not in ("LOCK_KEY", "CRON_SCHEDULE")}
    env.update(PATH=dislock_on_path(tmp_path), PGOPTIONS=f"-c search_path={schema}")

    def order(n: int, when: str = "clock_timestamp()") -> datetime:
        inserted = db.execute(
            sql.SQL("INSERT INTO {}.orders VALUES (%s, 10, {}) RETURNING updated_at").format(
                sql.Identifier(schema), sql.SQL(when)
            ),
            (n,),
        ).fetchone()
        assert inserted is not None
        return inserted[0]  # type: ignore[no-any-return]

    def night(changed: datetime) -> subprocess.CompletedProcess[str]:
        """The next night's run, once the clock is past the second ``changed`` was in."""
        eventually(
            lambda: (
                db.execute(
                    "SELECT now() >= date_trunc('second', %s::timestamptz) + interval '1 s'",
                    (changed,),
                ).fetchone()
                == (True,)
            )
        )
        return subprocess.run(
            ["bash", "-c", command], env=env, capture_output=True, text=True, timeout=60
        )

    def exported(result: subprocess.CompletedProcess[str]) -> tuple[str, list[int]]:
        """The night's slot start (its file's name) and the orders in its file."""
        assert result.returncode == 0, result.stderr
        (path,) = set(exports.glob("*.csv")) - seen
        seen.add(path)
        with path.open() as rows:
            return path.stem.removeprefix("orders-"), [int(row[0]) for row in csv.reader(rows)]

    seen: set[Path] = set()
    order(1, "now() - interval '1 day'")
    first = night(order(2))
    first_start, ids = exported(first)
    assert ids == [1, 2] and "2 orders changed since the beginning" in first.stdout
    second = night(order(3))
    second_start, ids = exported(second)
    assert ids == [3] and f"1 orders changed since {first_start}" in second.stdout
    assert second_start > first_start

    aside = exports.rename(tmp_path / "aside")  # the third night fails: nowhere to write
    failed = night(order(4))
    assert failed.returncode == 1 and "FileNotFoundError" in failed.stderr
    aside.rename(exports)
    ((outcome,),) = db.execute(
        sql.SQL("SELECT outcome FROM {} ORDER BY id DESC LIMIT 1").format(history)
    ).fetchall()
    assert outcome == "failed"

    fourth = night(order(5))
    _, ids = exported(fourth)
    assert ids == [4, 5] and f"2 orders changed since {second_start}" in fourth.stdout
