"""The status page of ``dislockctl serve`` in a real browser (headless Chromium).

The browser loads the page over HTTP, the test reads the rows back from the DOM
it built, and takes the screenshot ``docs/operator.md`` shows (written to
``$TEST_SCREENSHOT`` when set:
``TEST_SCREENSHOT=docs/status-page.png hatch test tests/cli/test_status_page.py``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import datetime, timedelta, timezone
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql

from tests.cli.serving import Fleet, StripKey, make_fleet, make_strip_key, run_job, serving

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # we are root in CI; the sandbox refuses to start as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("no Chromium on this machine (Debian: apt-get install chromium; .ci/run does)")
    return found


def browse(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )


class Rows(HTMLParser):
    """The ``<tr data-key=…>`` rows of the page, in order, the slot strip's cells of each
    (class and title), the runs of a key's page (``<tr data-run=…>``), and every tag seen."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, str]] = []
        self.cells: dict[str, list[tuple[str, str]]] = {}
        self.runs: list[dict[str, str]] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        found = {name: value or "" for name, value in attrs}
        if tag == "tr" and "data-key" in found:
            self.rows.append(found)
            self.cells[found["data-key"]] = []
        elif tag == "tr" and "data-run" in found:
            self.runs.append(found)
        elif tag == "i" and found.get("role") == "img" and self.rows:
            self.cells[self.rows[-1]["data-key"]].append((found["class"], found["title"]))


def parsed(dom: str) -> Rows:
    page = Rows()
    page.feed(dom)
    return page


SLOT_TIME = re.compile(r"(?:(\d{4}-\d{2}-\d{2}) )?(\d{2}:\d{2}) ")


def assert_strip(cells: list[tuple[str, str]], strip: StripKey, now: datetime) -> None:
    """Thirty cells, each in the state of its slot in the plan, named by its title."""
    assert len(cells) == 30, cells
    for classes, title in cells:
        found = SLOT_TIME.match(title)
        assert found is not None, title
        day = found.group(1) or f"{now.astimezone(timezone.utc):%Y-%m-%d}"
        start = datetime.fromisoformat(f"{day}T{found.group(2)}+00:00")
        state = strip.expected(start)
        assert classes.split()[0] == f"s-{state}", (title, classes, state)
        assert state.replace("_", " ").replace("done", "ok") in title, title
    running = [title for classes, title in cells if classes.startswith("s-running")]
    assert len(running) == 1 and running[0].endswith("(slow)"), running  # past its envelope


def history_table(env: dict[str, str]) -> sql.Identifier:
    schema, table = env["LOCK_TABLE"].split(".")
    return sql.Identifier(schema, f"{table}_history")


def assert_fleet_rows(page: Rows, fleet: Fleet, hostile: str, dom: str, now: datetime) -> None:
    """The fleet's rows: each key's state and outcome, escaped texts, the missed count."""
    rows = {row["data-key"]: row for row in page.rows}
    assert rows[fleet.ok]["data-state"] == "released"
    assert rows[fleet.ok]["data-outcome"] == "ok"
    assert rows[fleet.failed]["data-outcome"] == "failed"
    assert rows[fleet.lost]["data-outcome"] == "lease_lost"
    assert rows[fleet.abandoned]["data-state"] == "expired"
    assert rows[fleet.lost]["data-state"] == "released"
    assert "lease of" in dom and "released by dislockctl" in dom  # the lost key's lease
    assert rows[fleet.abandoned]["data-outcome"] == "abandoned"
    assert rows[fleet.paused]["data-state"] == "paused"
    expected = {str(n) for n in fleet.missed_expected(now)}
    assert rows[fleet.missed]["data-missed"] in expected, rows[fleet.missed]
    assert rows[fleet.ok]["data-missed"] == "-"  # no schedule
    assert rows[fleet.failed]["data-missed"] == "0"
    # The hostile key is text in the browser, not markup.
    assert rows[hostile]["data-outcome"] == "ok"
    assert "img" not in page.tags
    # The failed run's output: folded under its outcome, markup as text, the escape inert.
    assert "details" in page.tags and "pre" in page.tags
    assert '&lt;img src=y onerror="alert(2)"&gt;' in dom, dom
    assert "\\x1b[31mdisk full" in dom and "\x1b" not in dom
    assert "disk &lt;full&gt; &amp; slow" in dom  # the pause reason, escaped


def test_the_page_in_a_browser(
    history_env: dict[str, str], db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    fleet = make_fleet(history_env, db, tmp_path)
    hostile = '<img src=x onerror="alert(1)"> & "friends"'
    lease = {"LOCK_STRATEGY": "lease", "RUN_LOCK_TTL_SECONDS": "3"}
    assert run_job(history_env, "true", LOCK_KEY=hostile, **lease).returncode == 0
    # A failed run whose output's end is kept, with markup and a terminal escape in it.
    told = "echo '<img src=y onerror=\"alert(2)\">'; printf '\\033[31mdisk full\\n' >&2; exit 5"
    tail_key = f"{fleet.failed}-told"
    told_run = run_job(
        history_env, "sh", "-c", told, LOCK_KEY=tail_key, LOCK_OUTPUT_TAIL_BYTES="200", **lease
    )
    assert told_run.returncode == 5, told_run.stderr

    # A yearly slot whose run is over: its slot is taken until the new year, nothing runs.
    taken = f"{fleet.ok}-yearly"
    yearly = {"LOCK_STRATEGY": "schedule", "CRON_SCHEDULE": "0 0 1 1 *"}
    assert run_job(history_env, "true", LOCK_KEY=taken, **yearly).returncode == 0

    strip = make_strip_key(history_env, db, tmp_path)
    screenshot = Path(os.environ.get("TEST_SCREENSHOT") or tmp_path / "status-page.png")
    try:
        with serving(history_env) as served:
            dom = browse(served.base, tmp_path / "profile", "--dump-dom").stdout
            rendered_by = db.execute("SELECT NOW()").fetchone()
            browse(
                served.base,
                tmp_path / "profile",
                f"--screenshot={screenshot.resolve()}",
                "--window-size=1280,900",
            )
            own = served.base + "key/" + quote(strip.key, safe="")
            key_dom = browse(own, tmp_path / "profile", "--dump-dom").stdout
            unknown = served.get("/key/" + quote(f"{strip.key}-nobody", safe=""))
            hostile_page = served.get("/key/" + quote(hostile, safe=""))
            recorded = db.execute(
                sql.SQL(
                    "SELECT outcome FROM {} WHERE lock_key = %s ORDER BY started_at DESC"
                ).format(history_table(history_env)),
                (strip.key,),
            ).fetchall()
    finally:
        strip.running.terminate()
        strip.running.wait(timeout=60)
    assert rendered_by is not None

    page = parsed(dom)
    order = [row["data-key"] for row in page.rows]
    # The newest failures first (the abandoned run started last of the fleet's three),
    # then the keys that missed slots, then the rest by name.
    failing = [tail_key, fleet.abandoned, fleet.lost, fleet.failed]
    assert order[:6] == [*failing, fleet.missed, strip.key], order
    assert sorted(order[6:]) == order[6:]
    assert set(order) == {
        *failing,
        fleet.ok,
        fleet.paused,
        fleet.missed,
        hostile,
        strip.key,
        taken,
    }
    assert_fleet_rows(page, fleet, hostile, dom, rendered_by[0])
    assert_strip(page.cells[strip.key], strip, rendered_by[0])
    taken_row = next(row for row in page.rows if row["data-key"] == taken)
    assert taken_row["data-state"] == "slot taken" and "slot taken by " in dom

    # The key's own page: its row and strip, and every one of its runs, newest first.
    own_page = parsed(key_dom)
    assert [row["data-key"] for row in own_page.rows] == [strip.key]
    assert_strip(own_page.cells[strip.key], strip, rendered_by[0])
    shown = [run["data-outcome"] for run in own_page.runs]
    assert shown == [outcome or "running" for (outcome,) in recorded], shown
    assert {"running", "timed_out", "held_back", "failed", "ok", "paused"} <= set(shown)
    assert unknown[0] == 404
    assert hostile_page[0] == 200 and "<img" not in hostile_page[2]
    assert "&lt;img src=x" in hostile_page[2]

    image = screenshot.read_bytes()
    assert image.startswith(b"\x89PNG\r\n\x1a\n") and len(image) > 10_000


# Measures the page as laid out, and writes what it found where --dump-dom shows it.
MEASURE = """<script>
const box = (element) => element.getBoundingClientRect();
const row = document.querySelector('tr[data-key^="kkkk"]');
const found = {
  viewport: document.documentElement.clientWidth,
  headers: [...document.querySelectorAll("#keys th")].map((th) => box(th).right),
  key: box(row.cells[0]).width,
  title: row.cells[0].title.length,
  stampLines: [...document.querySelectorAll(".when small")].map((s) => s.getClientRects().length),
  badges: Object.fromEntries([...document.querySelectorAll(".badge")].map(
    (b) => [b.classList[1], getComputedStyle(b).backgroundColor])),
};
document.body.dataset.measured = JSON.stringify(found);
</script></body>"""


def test_a_long_key_and_every_outcome_fit_a_1280_px_screen_styled(
    history_env: dict[str, str], tmp_path: Path
) -> None:
    long_key = "k" * 2000
    assert run_job(history_env, "true", LOCK_KEY=long_key).returncode == 0
    timed_out = run_job(history_env, "sleep", "5", LOCK_KEY="over", LOCK_MAX_RUNTIME_SECONDS="1")
    assert timed_out.returncode == 124, timed_out.stderr
    began = datetime.now(timezone.utc) - timedelta(hours=2)
    late = {"CRON_SCHEDULE": f"{began.minute} {began.hour} * * *", "CRON_TZ": "UTC"}
    assert run_job(history_env, "true", LOCK_KEY="late", LOCK_START_DEADLINE_SECONDS="60", **late)
    assert run_job(history_env, "false", LOCK_KEY="failed").returncode == 1
    with serving(history_env) as served:
        status, _, page = served.get("/")
    assert status == 200
    measured_page = tmp_path / "page.html"
    measured_page.write_text(page.replace("</body>", MEASURE))
    window = "--window-size=1280,760"
    dom = browse(measured_page.as_uri(), tmp_path / "profile", "--dump-dom", window).stdout
    found = re.search(r'data-measured="([^"]*)"', dom)
    assert found is not None, dom[-2000:]
    measured = json.loads(unescape(found.group(1)))
    assert measured["viewport"] <= 1280
    assert max(measured["headers"]) <= measured["viewport"], measured  # every column on screen
    assert measured["key"] <= 260, measured  # the key wraps in its column...
    assert measured["title"] == 2000  # ...and is whole on hover
    assert set(measured["stampLines"]) == {1}, measured  # a date on one line
    badges = measured["badges"]
    red, unstyled = badges["failed"], "rgba(0, 0, 0, 0)"
    assert badges["timed_out"] == red and red not in (unstyled, badges["ok"]), badges
    assert badges["late"] not in (red, unstyled, badges["ok"]), badges
