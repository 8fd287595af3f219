"""The one-line decorator the README points to, extracted from docs/api-sync.md and run as
pasted on two replicas: two processes call it in the same schedule slot against the real
database. One runs the function; the other exits 0 quietly: no traceback, one INFO line saying
it skipped the call. The page says ``dislock.aio.with_locks`` is the same for a coroutine, so
the block is run that way too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

PAGE = Path(__file__).resolve().parents[2] / "docs" / "api-sync.md"

# One replica: a service that configured logging at INFO, as a scheduler's usually is, and
# calls the function once, as its scheduler would at 06:00. The block runs as written;
# only ``send_digest``, which it leaves to the reader, is given (it notes who ran).
REPLICA = textwrap.dedent(
    """
    import asyncio, logging, os, pathlib, sys

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    block, ran = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])


    def send_digest():
        with ran.open("a") as out:
            out.write(f"{os.getpid()}\\n")


    namespace = {"send_digest": send_digest}
    exec(compile(block.read_text(), "api-sync.md", "exec"), namespace)
    called = namespace["daily_digest"]()
    if asyncio.iscoroutine(called):
        asyncio.run(called)
    """
)
SKIPPED = re.compile(r"INFO dislock: skipped daily_digest: .*")


def page_block(marker: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    (block,) = [block for block in blocks if marker in block]
    return str(block)


def as_coroutine(block: str) -> str:
    """The block with ``dislock.aio.with_locks`` on a coroutine, as the page says to."""
    for old, new in [
        ("from dislock import with_locks\n", "from dislock.aio import with_locks\n"),
        ("def daily_digest(", "async def daily_digest("),
    ]:
        assert block.count(old) == 1, f"the decorator block has {old!r} not once"
        block = block.replace(old, new)
    return block


def zone_away_from_six() -> str:
    """A TZ in which the slot of ``0 6 * * *`` does not end while the test runs."""
    return "Etc/GMT-12" if datetime.now(UTC).hour in (5, 6) else "UTC"


def test_the_readme_quotes_the_decorator_line_of_the_block() -> None:
    (line,) = [
        line for line in page_block("def daily_digest(").splitlines() if "@with_locks(" in line
    ]
    assert f"`{line}`" in (PAGE.parents[1] / "README.md").read_text()


@pytest.mark.parametrize("flavour", ["sync", "aio"])
def test_the_readme_decorator_on_two_replicas_runs_once_and_skips_quietly(
    database_url: str, lock_table: tuple[str, str], tmp_path: Path, flavour: str
) -> None:
    block = page_block("def daily_digest(")
    code = tmp_path / "block.py"
    code.write_text(block if flavour == "sync" else as_coroutine(block))
    replica = tmp_path / "replica.py"
    replica.write_text(REPLICA)
    ran = tmp_path / "ran"
    # The block's unqualified key_value resolves to this test's own table.
    params = conninfo_to_dict(database_url)
    params["options"] = f"-c search_path={lock_table[0]}"
    env = {**os.environ, "DATABASE_URL": make_conninfo("", **params), "TZ": zone_away_from_six()}

    replicas = [
        subprocess.Popen(
            [sys.executable, str(replica), str(code), str(ran)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outcomes: dict[int, tuple[int, str, str]] = {}
    for process in replicas:
        out, err = process.communicate(timeout=60)
        outcomes[process.pid] = (process.returncode, out, err)

    runs = ran.read_text().split() if ran.exists() else []
    assert len(runs) == 1, f"the function ran {len(runs)} times: {outcomes}"
    (winner,) = [pid for pid in outcomes if str(pid) == runs[0]]
    (skipper,) = [pid for pid in outcomes if pid != winner]
    status, _, err = outcomes[winner]
    assert status == 0 and "Traceback" not in err, err
    status, out, err = outcomes[skipper]
    assert (status, out) == (0, ""), err
    assert "Traceback" not in err, err
    # Logging is at INFO here: the skip is the one line (silent at Python's default WARNING).
    assert len(err.splitlines()) == 1 and SKIPPED.fullmatch(err.strip()), err
