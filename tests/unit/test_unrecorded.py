"""Run ends kept on the host for a later run to record (``dislock.core.unrecorded``)."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

from dislock.core import unrecorded
from dislock.core.history import RunEnd
from dislock.core.unrecorded import KeptEnd

URL = "postgresql://jobs:hunter2-secret@db.example:5433/app"
TABLE = ("ops", "locks_history")
WHEN = datetime(2026, 12, 3, 22, 0, 1, tzinfo=timezone.utc)


def test_a_kept_end_reads_back_as_written_and_holds_no_secret(tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path)}
    kept = KeptEnd(TABLE, 42, RunEnd("lease_lost", 75), WHEN)
    path = unrecorded.keep(URL, kept, env)
    assert path.parent == tmp_path / "dislock" / "unrecorded"
    assert "hunter2" not in path.name + path.read_text()
    assert os.stat(path.parent).st_mode & 0o077 == 0  # this user's alone
    assert list(unrecorded.kept_ends(URL, TABLE, env)) == [(path, kept)]
    unrecorded.forget(path)
    unrecorded.forget(path)  # twice: a run beside this one recorded it too
    assert list(unrecorded.kept_ends(URL, TABLE, env)) == []


def test_only_the_same_database_role_and_table_record_a_kept_end(tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path)}
    unrecorded.keep(URL, KeptEnd(TABLE, 1, RunEnd("ok", 0), WHEN), env)
    others = [
        (URL.replace("jobs:", "billing:"), TABLE),
        (URL.replace("/app", "/other"), TABLE),
        (URL.replace("5433", "5432"), TABLE),
        (URL, ("ops", "other_history")),
    ]
    for url, table in others:
        assert list(unrecorded.kept_ends(url, table, env)) == [], (url, table)
    # The password is not part of it: a rotated one still records the end.
    rotated = URL.replace("hunter2-secret", "new-secret")
    assert len(list(unrecorded.kept_ends(rotated, TABLE, env))) == 1


def test_no_folder_half_files_and_garbage_are_no_ends(tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path)}
    assert list(unrecorded.kept_ends(URL, TABLE, env)) == []
    path = unrecorded.keep(URL, KeptEnd(TABLE, 7, RunEnd("failed", 1), WHEN), env)
    path.with_suffix(".tmp").write_text('{"table": ')  # a write cut short
    (path.parent / path.name.replace("-7", "-8")).write_text("not json")
    assert [kept.run_id for _, kept in unrecorded.kept_ends(URL, TABLE, env)] == [7]


def test_one_run_records_a_bounded_number(tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path)}
    for run_id in range(unrecorded.MAX_FLUSHED + 5):
        unrecorded.keep(URL, KeptEnd(TABLE, run_id, RunEnd("ok", 0), WHEN), env)
    assert len(list(unrecorded.kept_ends(URL, TABLE, env))) == unrecorded.MAX_FLUSHED


def test_the_default_folder_is_under_home(tmp_path: Path) -> None:
    assert unrecorded.spool_dir({"HOME": str(tmp_path)}) == (
        tmp_path / ".local" / "state" / "dislock" / "unrecorded"
    )
