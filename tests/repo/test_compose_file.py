"""docker-compose.tests.yml cannot run here (no Docker engine), so check what it says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def load(name: str) -> Any:
    return yaml.safe_load((ROOT / name).read_text())


def readme_test_command() -> str:
    """The README's command for every test, its options included (Development's first)."""
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"^(hatch test\b[^#\n]*?)\s*# every test", readme, re.M)
    assert match, "README.md documents no `hatch test` command for every test"
    return match.group(1)


def readme_shared_server_command() -> str:
    """The README's command for a server of one's own (``TEST_DATABASE_URL=…``): the
    tests of two workers sharing that server."""
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"^TEST_DATABASE_URL=\S+ (hatch test\b[^#\n]*?)\s*(#|$)", readme, re.M)
    assert match, "README.md documents no `TEST_DATABASE_URL=… hatch test` command"
    return match.group(1)


def test_compose_runs_the_readme_test_command_against_its_postgres() -> None:
    compose = load("docker-compose.tests.yml")
    services = compose["services"]
    assert set(services) == {"postgres", "tests"}

    postgres = services["postgres"]
    assert re.fullmatch(r"postgres:\d+(\.\d+)?", postgres["image"])
    assert "healthcheck" in postgres

    tests = services["tests"]
    assert re.fullmatch(r"python:3\.(1[0-9])(-slim)?", tests["image"])
    assert tests["depends_on"]["postgres"]["condition"] == "service_healthy"
    command = " ".join(tests["command"])
    # The same words, in the shell's quotes of a YAML string.
    assert command.replace("'", '"').endswith(f"&& {readme_shared_server_command()}"), command
    url = tests["environment"]["TEST_DATABASE_URL"]
    assert re.match(r"postgresql://[^@]+@postgres:5432/", url)
    password = postgres["environment"]["POSTGRES_PASSWORD"]
    assert f":{password}@" in url


def test_compose_postgres_is_the_version_of_the_second_ci_leg() -> None:
    image = load("docker-compose.tests.yml")["services"]["postgres"]["image"]
    ci = (ROOT / ".ci" / "run").read_text()
    major = image.split(":")[1].split(".")[0]
    assert f"/usr/lib/postgresql/{major}/bin" in ci


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"^{readme_test_command()}$", ci, re.MULTILINE)


def test_ci_runs_the_readme_shared_server_command_on_its_postgresql_15() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    shared = re.escape(readme_shared_server_command())
    assert re.search(rf'^TEST_DATABASE_URL="[^"]+" {shared}$', ci, re.MULTILINE), shared
