"""README.md is a front door, not a manual: at most ``README_MAX_LINES`` lines, every link it
has into this repository (a heading of a docs page included) leads somewhere, and it shows
every hatch command CI (``.ci/run``) runs, as CI runs it. What left the README lives in docs/,
so every docs page is in the site's nav and linked from docs/index.md; the docs' own links are
held to the same check (``mkdocs build --strict`` checks pages, not headings)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README_MAX_LINES = 250
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The ids MkDocs gives the page's headings (Python-Markdown's toc slugify), code skipped."""
    found: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif (heading := re.match(r"#{1,6} (.+)", line)) and not fenced:
            text = unicodedata.normalize("NFKD", heading.group(1)).encode("ascii", "ignore")
            words = re.sub(r"[^\w\s-]", "", text.decode()).strip().lower()
            found.add(re.sub(r"[-\s]+", "-", words))
    return found


def broken_links(page: Path, text: str) -> list[str]:
    """The links of ``text`` (shown on ``page``) to a file or heading that does not exist."""
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (anchor and anchor not in anchors(linked)):
            broken.append(f"{page.relative_to(ROOT)}: {target}")
    return broken


def test_the_readme_is_short_and_its_links_lead_somewhere() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, "README.md: move the details to docs/"
    assert len(LINK.findall(text)) >= 10, "is the link reader broken?"
    assert broken_links(readme, text) == []


def test_the_docs_links_lead_to_pages_and_headings_that_exist() -> None:
    broken = [
        link for page in sorted(DOCS.glob("*.md")) for link in broken_links(page, page.read_text())
    ]
    assert broken == []


def test_the_checker_finds_a_missing_page_and_a_missing_heading() -> None:
    text = "[a](docs/cli.md#no-such-heading) [b](docs/gone.md) [c](docs/cli.md#exit-codes) [d](#x)"
    assert broken_links(ROOT / "README.md", text) == [
        "README.md: docs/cli.md#no-such-heading",
        "README.md: docs/gone.md",
        "README.md: #x",
    ]


def nav_pages(entries: list[Any]) -> set[str]:
    pages: set[str] = set()
    for entry in entries:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages |= nav_pages(value) if isinstance(value, list) else {value}
    return pages


def test_every_docs_page_is_in_the_nav_and_linked_from_the_index() -> None:
    pages = {page.name for page in DOCS.glob("*.md")}
    nav = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert pages - nav == set(), "in docs/ but not in mkdocs.yml's nav"
    linked = {target.partition("#")[0] for target in LINK.findall((DOCS / "index.md").read_text())}
    assert pages - linked - {"index.md"} == set(), "not linked from docs/index.md"


def ci_commands(script: str) -> list[str]:
    """The hatch commands a shell script runs (continued lines joined), without the variables
    set for them; the Python version of CI's loop reads as 3.13, the README's example."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        first = line.split(maxsplit=1)[0] if line.strip() else ""
        found = re.search(r"(?:^|\s)(hatch (?:run|test)\b.*)", line)
        if found and (first == "hatch" or "=" in first):  # not a comment, nor an echo
            commands.append(re.sub(r"\s+", " ", found.group(1).replace('"$version"', "3.13")))
    return commands


def undocumented(commands: list[str], readme: str) -> list[str]:
    """The commands that no line of ``readme`` runs (after a ``TEST_DATABASE_URL=`` of its own)."""
    lines = {
        re.sub(r"^TEST_DATABASE_URL=\S+ ", "", line.split("  #")[0].strip())
        for line in readme.splitlines()
    }
    return [command for command in commands if command not in lines]


def test_the_readme_documents_every_hatch_command_ci_runs() -> None:
    commands = ci_commands((ROOT / ".ci" / "run").read_text())
    assert len(commands) >= 10 and "hatch test -p" in commands, commands
    assert undocumented(commands, (ROOT / "README.md").read_text()) == []


def test_the_ci_reader_sees_a_continued_line_and_a_missing_command() -> None:
    script = (
        'A="$(dirname "$b"):x" \\\n  hatch test -- -m "not slow"\n  B=1 hatch run nothing\n'
        '# hatch run commented\nsection "hatch run echoed"\nhatch --version\n'
    )
    assert ci_commands(script) == ['hatch test -- -m "not slow"', "hatch run nothing"]
    readme = 'X=1\nTEST_DATABASE_URL=postgresql://h/db hatch test -- -m "not slow"   # ok\n'
    assert undocumented(['hatch test -- -m "not slow"', "hatch run nothing"], readme) == [
        "hatch run nothing"
    ]
