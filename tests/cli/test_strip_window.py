"""The slot strip reaches past serve's 24 h window: a daily key's strip is its last 30
days when the history has them (and only the days since its first run when it has
fewer), each cell in the state ``missed`` would judge; a key's page lists its audit
trail's lines, the reason escaped, and says so when there is no trail."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from html.parser import HTMLParser
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import sql

from dislock.core.rows import schedule_key
from tests.cli.serving import Served, ctl, run_job, serving
from tests.cli.test_status_page import Rows

DAY = timedelta(days=1)
COLUMNS = sql.SQL("lock_key, modes, owner, host, pid, outcome, exit_code, signal, cron, cron_tz")


class AuditLines(HTMLParser):
    """The text of each ``<li>`` of ``<ul id="audit">``, and the text of ``#audit`` itself."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.text = ""
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if ("id", "audit") in attrs or self._depth:
            self._depth += 1
            if tag == "li":
                self.lines.append("")

    def handle_endtag(self, tag: str) -> None:
        self._depth = max(0, self._depth - 1) if self._depth else 0

    def handle_data(self, data: str) -> None:
        if self._depth:
            self.text += data
            if self.lines:
                self.lines[-1] += data


def daily_job(
    env: dict[str, str], db: psycopg.Connection[Any], key: str
) -> tuple[dict[str, str], datetime]:
    """A schedule once a day at a time six hours ago (database clock): its current slot
    began then, well judged and far from a day's edge; the job's env and that start."""
    found = db.execute("SELECT date_trunc('minute', NOW() - interval '6 hours')").fetchone()
    assert found is not None
    start: datetime = found[0]
    cron = f"{start.minute} {start.hour} * * *"
    job = {**env, "LOCK_STRATEGY": "schedule", "CRON_SCHEDULE": cron, "CRON_TZ": "UTC"}
    return {**job, "LOCK_KEY": key}, start


def page_day(db: psycopg.Connection[Any]) -> date:
    """Today, UTC, on the database clock the page is drawn by."""
    found = db.execute("SELECT (NOW() AT TIME ZONE 'UTC')::date").fetchone()
    assert found is not None
    day: date = found[0]
    return day


def history(env: dict[str, str]) -> sql.Identifier:
    schema, table = env["LOCK_TABLE"].split(".")
    return sql.Identifier(schema, f"{table}_history")


def ran(
    job: dict[str, str], db: psycopg.Connection[Any], command: str, code: int, let_go: bool = False
) -> int:
    """A real run of ``command`` in the current slot (its slot's row let go, for a run
    moved back after it); its id."""
    result = run_job(job, "sh", "-c", command)
    assert result.returncode == code, result.stderr
    if let_go:
        schema, table = job["LOCK_TABLE"].split(".")
        db.execute(
            sql.SQL("DELETE FROM {} WHERE key = %s").format(sql.Identifier(schema, table)),
            (schedule_key(job["LOCK_KEY"]),),
        )
    found = db.execute(
        sql.SQL("SELECT max(id) FROM {} WHERE lock_key = %s").format(history(job)),
        (job["LOCK_KEY"],),
    ).fetchone()
    assert found is not None
    return int(found[0])


def copy_back(job: dict[str, str], db: psycopg.Connection[Any], run_id: int, days: int) -> None:
    """The run ``run_id`` as if it had run in the slot ``days`` days before its own."""
    db.execute(
        sql.SQL(
            "INSERT INTO {table} ({columns}, slot_end, started_at, ended_at)"
            " SELECT {columns}, slot_end - %(back)s, started_at - %(back)s, ended_at - %(back)s"
            " FROM {table} WHERE id = %(id)s"
        ).format(table=history(job), columns=COLUMNS),
        {"back": days * DAY, "id": run_id},
    )


def cells(served: Served, path: str, key: str) -> list[tuple[str, str]]:
    status, _, body = served.get(path)
    assert status == 200, body
    page = Rows()
    page.feed(body)
    return page.cells[key]


def expected(days_back: int) -> str:
    """The daily key's plan: done today, failed a day back and every fifth day, nothing
    every seventh from the third, done otherwise."""
    if days_back == 1 or (days_back % 5 == 0 and days_back % 7 != 3 and days_back):
        return "failed"
    return "missed" if days_back % 7 == 3 else "done"


def test_a_daily_keys_strip_shows_its_last_30_days(
    history_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    job, start = daily_job(history_env, db, f"{history_env['LOCK_KEY']}-daily")
    failed = ran(job, db, "exit 3", 3, let_go=True)
    db.execute(  # moved into yesterday's slot
        sql.SQL(
            "UPDATE {} SET slot_end = slot_end - %(day)s, started_at = started_at - %(day)s,"
            " ended_at = ended_at - %(day)s WHERE id = %(id)s"
        ).format(history(job)),
        {"day": DAY, "id": failed},
    )
    ok = ran(job, db, "true", 0)
    for days in range(2, 41):  # more than 30 days of history
        if expected(days) == "done":
            copy_back(job, db, ok, days)
        elif expected(days) == "failed":
            copy_back(job, db, failed, days - 1)
    new, new_start = daily_job(history_env, db, f"{history_env['LOCK_KEY']}-new")
    first = ran(new, db, "true", 0)
    for days in (1, 2):  # three days of history
        copy_back(new, db, first, days)

    with serving(history_env) as served:
        for path in ("/", "/key/" + quote(job["LOCK_KEY"], safe="")):
            # The page leaves the date out of a slot of its own day (UTC), which the
            # current slot is unless the page was drawn within 6 h after midnight.
            before = page_day(db)
            shown = cells(served, path, job["LOCK_KEY"])
            drawn_on = {before, page_day(db)}  # two days: drawn as midnight passed
            assert len(shown) == 30, (path, shown)
            for back, (classes, title) in zip(range(29, -1, -1), shown, strict=True):
                slot = start - back * DAY
                assert classes.split()[0] == f"s-{expected(back)}", (path, back, title)
                day = slot.astimezone(timezone.utc).date()
                labels = {f"{slot:%Y-%m-%d %H:%M} " for _ in drawn_on if day != _}
                labels |= {f"{slot:%H:%M} " for _ in drawn_on if day == _}
                assert any(title.startswith(label) for label in labels), (title, labels)
        young = cells(served, "/", new["LOCK_KEY"])
        assert [classes.split()[0] for classes, _ in young] == ["s-done"] * 3, young
        assert young[0][1].startswith(f"{new_start - 2 * DAY:%Y-%m-%d %H:%M} ")


def test_a_keys_page_lists_its_audit_trail(
    history_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    job, _ = daily_job(history_env, db, f"{history_env['LOCK_KEY']}-audited")
    ran(job, db, "true", 0)
    hostile = '<script>alert(1)</script> & "disk full"'
    with serving(history_env) as served:
        path = "/key/" + quote(job["LOCK_KEY"], safe="")
        status, _, body = served.get(path)
        assert status == 200, body
        none = AuditLines()
        none.feed(body)
        assert none.lines == [] and "no audit trail" in none.text, none.text

        assert ctl(job, "init").returncode == 0  # creates the trail
        for verb, reason in (("pause", hostile), ("resume", "back <b>now</b>")):
            done = ctl(job, verb, job["LOCK_KEY"], "--reason", reason)
            assert done.returncode == 0, done.stderr
        status, _, body = served.get(path)
    assert status == 200, body
    trail = AuditLines()
    trail.feed(body)
    resumed, paused = trail.lines  # newest first
    assert " resume " in resumed and resumed.endswith("reason: back <b>now</b>"), resumed
    assert " pause " in paused and paused.endswith(f"reason: {hostile}"), paused
    assert "<script>" not in body and "<b>now" not in body
