"""Each distribution's README.md, the page PyPI shows for it, is a real page: at least
``README_MIN_LINES`` lines, which ``tools/release_check.py`` (``hatch run release:check``)
enforces before it builds anything; an install line; links to the docs that exist. Their
Python examples run in ``tests/examples/test_package_readmes.py``."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.repo.test_credential_story import SCHEDULE, fenced_blocks

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "release_check.py"


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release_check", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("release_check", module)
    spec.loader.exec_module(module)
    return module


def write_readme(root: Path, package: str, lines: int) -> None:
    folder = root / "packages" / package
    folder.mkdir(parents=True)
    (folder / "README.md").write_text("".join(f"line {n}\n" for n in range(lines)))


def test_a_short_readme_fails_the_release_check_saying_which(
    tool: ModuleType, tmp_path: Path
) -> None:
    write_readme(tmp_path, "dislock", 7)
    write_readme(tmp_path, "dislock-aio", tool.README_MIN_LINES)
    with pytest.raises(SystemExit) as caught:
        tool.check_readmes(tmp_path, ("dislock", "dislock-aio", "dislock-cli"))
    assert str(caught.value) == (
        "release-check: FAILED: packages/dislock/README.md has 7 lines;"
        " packages/dislock-cli/README.md has 0 lines: a distribution's README is its PyPI page"
        " and needs at least 30 lines (what it is, the install line, an example, links to the"
        " docs)"
    )


def test_a_readme_of_the_minimum_passes(
    tool: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_readme(tmp_path, "dislock", tool.README_MIN_LINES)
    tool.check_readmes(tmp_path, ("dislock",))
    assert "READMEs: each distribution's has at least 30 lines" in capsys.readouterr().out


def test_every_distributions_readme_passes_the_check(tool: ModuleType) -> None:
    tool.check_readmes()


@pytest.mark.parametrize("package", ["dislock-core", "dislock", "dislock-aio", "dislock-cli"])
def test_each_readme_says_how_to_install_it_and_links_docs_that_exist(package: str) -> None:
    readme = ROOT / "packages" / package / "README.md"
    text = readme.read_text()
    assert text.startswith(f"# {package}\n")
    assert re.search(rf"^pipx? install {package}\b", text, flags=re.M), "no install line"
    assert f"./packages/{package}" in text, "no install line for a clone"
    links = re.findall(r"\]\((\.\./\.\./docs/[^)#]+)", text)
    assert links, "no link to the docs"
    missing = [link for link in links if not (readme.parent / link).resolve().is_file()]
    assert not missing, f"{readme.relative_to(ROOT)} links to missing pages: {missing}"


def test_the_cli_readme_job_lines_read_the_url_from_the_file() -> None:
    """README.md's credential story (``repo/test_credential_story.py``): each job line
    reads the chmod-600 file with ``.``; the URL is in that file, never in the crontab."""
    text = (ROOT / "packages" / "dislock-cli" / "README.md").read_text()
    assert "chmod 600" in text and "# /etc/dislock/jobs.env\nset -a\nDATABASE_URL=" in text
    crontabs = [block for block in fenced_blocks(text) if block.looks_like_a_crontab()]
    jobs = [line for block in crontabs for line in block.lines if SCHEDULE.match(line)]
    assert len(jobs) == 2
    for job in jobs:
        assert " . /etc/dislock/jobs.env && LOCK_KEY=" in job and " dislock DATABASE_URL " in job
