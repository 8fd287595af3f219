#!/usr/bin/env python3
"""Build every distribution and check that each install story works from the files.

    hatch run release:build            # wheels and sdists of all four into dist/
    hatch run release:check            # build into dist/, then check
    hatch run release:check --no-build # check what is already in dist/

First, before building: each distribution's README.md, the page PyPI shows for it,
has at least ``README_MIN_LINES`` lines (what it is, how to install it, an example,
links to the documentation).

Then checks, each against freshly built wheels in a fresh virtualenv:

* the wheels: each ships ``py.typed``, no two ship the same file (pip would
  silently overwrite it), all have one version and pin each other to it exactly;
* ``pip install dislock``: the sync API takes a real lock; no aio or CLI code (nor
  ``prometheus_client``, which only the CLI needs);
* ``pip install dislock-aio``: the async API takes a real lock and
  ``from dislock import LockContext`` works; the sync distribution is absent and
  its names fail with an ImportError naming ``pip install dislock``;
* ``pipx install dislock-cli``: ``dislock --help`` and a real locked run work;
* ``pip install 'dislock-cli[otel]'``: a run is a span, child of ``TRACEPARENT``
  (printed by the console exporter).  Only this story installs OpenTelemetry.

The real locks run against ``TEST_DATABASE_URL`` or an embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from email.parser import Parser
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dislock-core", "dislock", "dislock-aio", "dislock-cli")
DIST = ROOT / "dist"
README_MIN_LINES = 30
"""A distribution's README.md (its PyPI page) shorter than this fails the check."""


def say(message: str) -> None:
    print(f"release-check: {message}", flush=True)


def fail(message: str) -> NoReturn:
    raise SystemExit(f"release-check: FAILED: {message}")


def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)
    if result.returncode != 0:
        fail(f"{' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return result


def build_into(
    dist: Path,
    targets: Sequence[str] = ("wheel", "sdist"),
    packages: Sequence[str] = PACKAGES,
    root: Path = ROOT,
) -> str | None:
    """Build ``packages`` (their ``targets``) of the checkout at ``root`` into ``dist`` with
    hatch; None when all were built, else what failed.  The benchmark builds its wheels
    with it too (of an older revision's checkout as well)."""
    # Inside `hatch run`, HATCH_ENV_ACTIVE names this workspace's environment,
    # which the member projects do not have.
    env = {k: v for k, v in os.environ.items() if not k.startswith("HATCH_ENV")}
    for package in packages:
        args = ["hatch", "build", *(f"--target={target}" for target in targets), str(dist)]
        result = subprocess.run(
            args,
            cwd=root / "packages" / package,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            return f"{' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}"
    return None


def check_readmes(root: Path = ROOT, packages: Sequence[str] = PACKAGES) -> None:
    """Fail unless each of ``packages`` has a README.md (under ``root``/packages) of at
    least ``README_MIN_LINES`` lines: it is what PyPI shows of the distribution."""
    short = []
    for package in packages:
        readme = root / "packages" / package / "README.md"
        lines = len(readme.read_text().splitlines()) if readme.exists() else 0
        if lines < README_MIN_LINES:
            short.append(f"packages/{package}/README.md has {lines} lines")
    if short:
        fail(
            f"{'; '.join(short)}: a distribution's README is its PyPI page and needs at least"
            f" {README_MIN_LINES} lines (what it is, the install line, an example, links to"
            " the docs)"
        )
    say(f"READMEs: each distribution's has at least {README_MIN_LINES} lines")


def build() -> None:
    shutil.rmtree(DIST, ignore_errors=True)
    failed = build_into(DIST)
    if failed is not None:
        fail(failed)
    say(f"built {len(list(DIST.iterdir()))} files into dist/")


def wheel_of(package: str) -> Path:
    name = package.replace("-", "_")
    found = sorted(DIST.glob(f"{name}-*.whl"))
    if len(found) != 1:
        fail(f"expected one wheel of {package} in dist/, found {[p.name for p in found]}")
    return found[0]


def check_wheels() -> str:
    owners: dict[str, str] = {}
    versions: dict[str, str] = {}
    requirements: dict[str, list[str]] = {}
    for package in PACKAGES:
        with zipfile.ZipFile(wheel_of(package)) as wheel:
            names = wheel.namelist()
            metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
            metadata = Parser().parsestr(wheel.read(metadata_name).decode())
        versions[package] = metadata["Version"]
        requirements[package] = metadata.get_all("Requires-Dist") or []
        payload = [n for n in names if ".dist-info/" not in n]
        if not any(n.endswith("py.typed") for n in payload):
            fail(f"{package}'s wheel has no py.typed")
        for name in payload:
            if name in owners:
                fail(f"{name} is shipped by both {owners[name]} and {package}")
            owners[name] = package
    if len(set(versions.values())) != 1:
        fail(f"versions differ: {versions}")
    version = versions["dislock-core"]
    for package, requires in requirements.items():
        for requirement in requires:
            match = re.match(r"(dislock(?:-[a-z]+)?)\s*(.*)", requirement)
            if match and match.group(1) in PACKAGES and match.group(2) != f"=={version}":
                fail(f"{package} requires {requirement!r}, not =={version}")
    say(f"wheels: one version ({version}), exact pins, py.typed in each, no shared files")
    return version


@contextmanager
def database() -> Iterator[str]:
    sys.path.insert(0, str(ROOT))
    from tests.support.postgres import postgres_url

    with postgres_url() as url:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS release_check_locks")
            conn.execute(
                "CREATE TABLE release_check_locks (key text PRIMARY KEY,"
                " value text NOT NULL, expire_at timestamptz NOT NULL)"
            )
        yield url


def venv(where: Path, *requirements: str) -> Path:
    run([sys.executable, "-m", "venv", str(where)])
    python = where / "bin" / "python"
    run([str(python), "-m", "pip", "install", "--quiet", "--find-links", str(DIST), *requirements])
    return python


def check_python(python: Path, code: str, url: str) -> str:
    env = {**os.environ, "DATABASE_URL": url}
    return run(
        [str(python), "-c", textwrap.dedent(code)], env=env, cwd=tempfile.gettempdir()
    ).stdout


SYNC_STORY = """
    import importlib.util, os
    from dislock import LockContext, ScheduleLock, acquire_locks
    assert importlib.util.find_spec("dislock.aio") is None, "aio code installed"
    assert importlib.util.find_spec("dislock.cli") is None, "CLI code installed"
    assert importlib.util.find_spec("prometheus_client") is None, "a CLI-only dependency installed"
    assert importlib.util.find_spec("opentelemetry") is None, "an OpenTelemetry package installed"
    ctx = LockContext(url=os.environ["DATABASE_URL"], table_parts=["release_check_locks"],
                      lock_key="sync-story", owner="sync:1", schedule="0 0 1 1 *",
                      run_ttl_seconds=5, lease_interval_seconds=1)
    with acquire_locks(ctx, ("schedule", "lease")) as session:
        assert not session.lease_lost.is_set()
    print("sync ok")
"""

AIO_STORY = """
    import asyncio, importlib.util, os
    from dislock import LockContext
    from dislock.aio import LeaseLock
    assert importlib.util.find_spec("dislock._sync") is None, "sync distribution installed"
    assert importlib.util.find_spec("prometheus_client") is None, "a CLI-only dependency installed"
    assert importlib.util.find_spec("opentelemetry") is None, "an OpenTelemetry package installed"
    try:
        from dislock import ScheduleLock
    except ImportError as exc:
        assert "pip install dislock" in str(exc), exc
    else:
        raise AssertionError("sync names imported without the sync distribution")

    async def main() -> None:
        ctx = LockContext(url=os.environ["DATABASE_URL"], table_parts=["release_check_locks"],
                          lock_key="aio-story", owner="aio:1",
                          run_ttl_seconds=5, lease_interval_seconds=1)
        async with LeaseLock(ctx) as lock:
            assert not lock.lease_lost.is_set()

    asyncio.run(main())
    print("aio ok")
"""


def check_cli(tmp: Path, url: str) -> None:
    tools = venv(tmp / "pipx-venv", "pipx")
    pipx_env = {
        **os.environ,
        "PIPX_HOME": str(tmp / "pipx-home"),
        "PIPX_BIN_DIR": str(tmp / "pipx-bin"),
        "PIPX_MAN_DIR": str(tmp / "pipx-man"),
        # Fresh caches: the wheels are rebuilt under the same name and version
        # each time, and a cached one (pipx may install with uv) would be stale.
        "UV_CACHE_DIR": str(tmp / "uv-cache"),
        "PIP_CACHE_DIR": str(tmp / "pip-cache"),
    }
    run(
        [
            str(tools),
            "-m",
            "pipx",
            "install",
            "--pip-args",
            f"--find-links {DIST}",
            str(wheel_of("dislock-cli")),
        ],
        env=pipx_env,
    )
    dislock = tmp / "pipx-bin" / "dislock"
    help_text = run([str(dislock), "--help"]).stdout
    if "LOCK_KEY" not in help_text:
        fail("dislock --help does not document LOCK_KEY")
    ctl_help = run([str(tmp / "pipx-bin" / "dislockctl"), "--help"]).stdout
    if not all(command in ctl_help for command in ("init", "ls", "release", "check", "serve")):
        fail("dislockctl --help does not list its commands")
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "LOCK_TABLE": "release_check_locks",
        "LOCK_KEY": "cli-story",
        "LOCK_STRATEGY": "schedule,lease",
        "CRON_SCHEDULE": "0 0 1 1 *",
    }
    first = run([str(dislock), "DATABASE_URL", "sh", "-c", "echo cli ran"], env=env)
    if first.stdout != "cli ran\n":
        fail(f"the pipx-installed dislock did not run the command: {first.stdout!r}")
    second = run([str(dislock), "DATABASE_URL", "sh", "-c", "echo ran twice"], env=env)
    if second.stdout:
        fail("the pipx-installed dislock ran the command twice in one slot")
    check_python(tmp / "pipx-home" / "venvs" / "dislock-cli" / "bin" / "python", NO_OTEL, url)
    say(
        "pipx install dislock-cli: dislock and dislockctl installed; a locked run works once a slot"
    )


NO_OTEL = """
    import importlib.util
    assert importlib.util.find_spec("opentelemetry") is None, "an OpenTelemetry package installed"
"""


def check_otel(tmp: Path, url: str) -> None:
    python = venv(tmp / "otel", f"{wheel_of('dislock-cli')}[otel]")
    trace_id, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "LOCK_TABLE": "release_check_locks",
        "LOCK_KEY": "otel-story",
        "LOCK_STRATEGY": "lease",
        "OTEL_TRACES_EXPORTER": "console",
        "TRACEPARENT": f"00-{trace_id}-{parent}-01",
    }
    dislock = python.parent / "dislock"
    ran = run([str(dislock), "DATABASE_URL", "sh", "-c", 'echo "$TRACEPARENT"'], env=env).stdout
    child, _, span = ran.partition("\n")
    if not child.startswith(f"00-{trace_id}-") or f'"parent_id": "0x{parent}"' not in span:
        fail(f"dislock-cli[otel] made no span under TRACEPARENT: {ran!r}")
    say("pip install 'dislock-cli[otel]': a run is a span, child of TRACEPARENT")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-build", action="store_true", help="check the files already in dist/")
    parser.add_argument("--build-only", action="store_true", help="only build into dist/")
    args = parser.parse_args()
    if not args.build_only:
        check_readmes()
    if not args.no_build:
        build()
    if args.build_only:
        return 0
    check_wheels()
    with database() as url, tempfile.TemporaryDirectory(prefix="dislock-release-") as tmp_dir:
        tmp = Path(tmp_dir)
        check_python(venv(tmp / "sync", str(wheel_of("dislock"))), SYNC_STORY, url)
        say("pip install dislock: sync API locks for real; no aio or CLI code")
        check_python(venv(tmp / "aio", str(wheel_of("dislock-aio"))), AIO_STORY, url)
        say("pip install dislock-aio: async API locks; sync names ask for pip install dislock")
        check_cli(tmp, url)
        check_otel(tmp, url)
    say("all install stories passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
