"""The Python examples of the distributions' own READMEs (their PyPI pages), run as written
against the real database: ``packages/dislock/README.md`` (sync),
``packages/dislock-aio/README.md`` (asyncio) and ``packages/dislock-core/README.md``. Only
what a block leaves to the reader (``send_digest``, ``batches``, ``load``) is given, and
``$DATABASE_URL`` names this test's table."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

PACKAGES = Path(__file__).resolve().parents[2] / "packages"


def python_block(distribution: str) -> str:
    text = (PACKAGES / distribution / "README.md").read_text()
    (block,) = re.findall(r"^```python\n(.*?)^```$", text, flags=re.M | re.S)
    return str(block)


@pytest.fixture
def readme_url(
    database_url: str, lock_table: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> str:
    """``$DATABASE_URL`` for the blocks: the test database, where their unqualified
    ``key_value`` is this test's own table."""
    params = conninfo_to_dict(database_url)
    params["options"] = f"-c search_path={lock_table[0]}"
    url = make_conninfo("", **params)
    monkeypatch.setenv("DATABASE_URL", url)
    return url


def held(url: str) -> dict[str, bool]:
    with psycopg.connect(url, autocommit=True) as conn:
        return dict(
            conn.execute(
                "SELECT key, expire_at > NOW() FROM key_value WHERE key LIKE 'cronjob-lock:%'"
            ).fetchall()
        )


def near_six() -> bool:
    """Whether the digest's slot (06:00 local) may end between two calls."""
    now = datetime.now()
    return (now.hour, now.minute) in ((5, 59), (6, 0))


def test_the_sync_readme_runs_the_digest_once_and_the_import_under_its_lease(
    readme_url: str,
) -> None:
    digests: list[int] = []
    loaded: list[tuple[int, bool]] = []

    def load(batch: int) -> None:
        loaded.append((batch, held(readme_url).get("cronjob-lock:lease:importer", False)))

    namespace: dict[str, Any] = {
        "send_digest": lambda: digests.append(1),
        "batches": lambda: [1, 2, 3],
        "load": load,
    }
    exec(compile(python_block("dislock"), "packages/dislock/README.md", "exec"), namespace)
    assert loaded == [(1, True), (2, True), (3, True)]  # every batch under the held lease
    assert held(readme_url)["cronjob-lock:lease:importer"] is False  # released after

    assert namespace["daily_digest"]() is None
    assert digests == [1]
    if not near_six():
        assert namespace["daily_digest"]() is None  # the slot is taken: skipped
        assert digests == [1]
    assert held(readme_url)["cronjob-lock:schedule:daily-digest"] is True


def test_the_asyncio_readme_runs_the_digest_once_and_the_import_under_its_lease(
    readme_url: str,
) -> None:
    digests: list[int] = []
    loaded: list[tuple[int, bool]] = []

    async def send_digest() -> None:
        digests.append(1)

    async def batches() -> AsyncIterator[int]:
        for batch in (1, 2, 3):
            yield batch

    async def load(batch: int) -> None:
        lease = await asyncio.to_thread(held, readme_url)
        loaded.append((batch, lease.get("cronjob-lock:lease:importer", False)))

    namespace: dict[str, Any] = {"send_digest": send_digest, "batches": batches, "load": load}
    block = python_block("dislock-aio")
    exec(compile(block, "packages/dislock-aio/README.md", "exec"), namespace)
    assert loaded == [(1, True), (2, True), (3, True)]
    assert held(readme_url)["cronjob-lock:lease:importer"] is False

    assert asyncio.run(namespace["daily_digest"]()) is None
    assert digests == [1]
    if not near_six():
        assert asyncio.run(namespace["daily_digest"]()) is None
        assert digests == [1]
    assert held(readme_url)["cronjob-lock:schedule:daily-digest"] is True


def test_the_core_readme_prints_what_its_comment_says(capsys: pytest.CaptureFixture[str]) -> None:
    block = python_block("dislock-core")
    exec(compile(block, "packages/dislock-core/README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert printed == (
        "schedule is not a valid cron expression: '60 3 * * *'"
        " (minute field '60' is out of range 0-59)\n"
    )
    (comment,) = re.findall(r"print\(error\)  # (.*?)\.\.\.\)?$", block, flags=re.M)
    assert printed.startswith(comment)
    assert "secret" not in printed
