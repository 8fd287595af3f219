"""``hatch run dev-db``: a local server that stays up for dislockctl, until Ctrl-C deletes it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]


def test_dev_db_prints_a_url_dislockctl_can_use_and_stops_on_ctrl_c() -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "examples.dev_db"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        printed = []
        deadline = time.monotonic() + 120
        for line in server.stdout:  # until it says how to stop it
            printed.append(line)
            if "Ctrl-C" in line or time.monotonic() > deadline:
                break
        text = "".join(printed)
        found = re.search(r"^  export DATABASE_URL='([^']+)'$", text, flags=re.M)
        assert found, text
        url = found.group(1)
        env = {**os.environ, "DATABASE_URL": url}
        ctl = [sys.executable, "-m", "dislock.cli.ctl", "DATABASE_URL"]
        init = subprocess.run([*ctl, "init"], env=env, capture_output=True, text=True)
        assert init.returncode == 0, init.stderr
        listed = subprocess.run([*ctl, "ls"], env=env, capture_output=True, text=True)
        assert listed.returncode == 0, listed.stderr
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT to_regclass('key_value')").fetchone() == ("key_value",)

        server.send_signal(signal.SIGINT)  # what Ctrl-C in its terminal sends
        rest = server.communicate(timeout=60)[0]
        assert server.returncode == 0, rest
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    data = re.search(r"host=(/\S+)", url)
    assert data, url
    assert not Path(data.group(1)).exists(), "the server's data outlived it"
