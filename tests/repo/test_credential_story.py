"""One credential story everywhere: README.md keeps the database URL in a file only the
job's user can read, which each crontab line reads with ``.``; never a ``NAME=postgresql://``
line in a crontab (Debian's cron copies every such line into each mail's ``X-Cron-Env:``
header) and never the URL on the job line. No crontab the README or the docs show, and not
``dislock --help``, may teach otherwise.

A crontab is a fenced block marked ``crontab``, or any fenced block holding a line that
starts with a cron schedule (``0 3 * * *``, ``*/5 * * * *``, ``@daily``)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "packages").glob("*/README.md")),
]

SETS_URL = re.compile(r"""(?:^|[\s;&|(`])[A-Za-z_][A-Za-z0-9_]*=['"]?postgres(?:ql)?://""")
"""A variable set to a PostgreSQL URL: on a line of its own (``DATABASE_URL=postgresql://…``)
or on a job line (``… && DATABASE_URL='postgres://…' dislock …``)."""

_TIME = r"[0-9*][0-9*,/-]*"
_DATE = rf"(?:{_TIME}|[A-Za-z]{{3}}(?:[-,][A-Za-z]{{3}})*)"
SCHEDULE = re.compile(
    rf"^\s*(?:@(?:reboot|yearly|annually|monthly|weekly|daily|midnight|hourly)"
    rf"|{_TIME}\s+{_TIME}(?:\s+{_DATE}){{3}})\s+\S"
)
"""A crontab job line: five fields (minute and hour numeric or ``*``; the others may be
names, ``mon-fri``) or an ``@`` nickname, then a command."""

FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([^\s`]*)")


@dataclass(frozen=True)
class Block:
    language: str
    first_line: int  # 1-based line number of the block's first line of content
    lines: list[str]

    def looks_like_a_crontab(self) -> bool:
        return self.language == "crontab" or any(SCHEDULE.match(line) for line in self.lines)


def fenced_blocks(markdown: str) -> list[Block]:
    """Every fenced code block of a Markdown page, indented ones (in lists) included."""
    blocks: list[Block] = []
    opened: tuple[str, str, int] | None = None  # fence, language, first content line
    content: list[str] = []
    for number, line in enumerate(markdown.splitlines(), start=1):
        fence = FENCE.match(line)
        if opened is None:
            if fence:
                opened = (fence.group(1), fence.group(2).lower(), number + 1)
                content = []
        elif fence and fence.group(1).startswith(opened[0]) and not fence.group(2):
            blocks.append(Block(opened[1], opened[2], content))
            opened = None
        else:
            content.append(line)
    assert opened is None, f"a fence opened on line {opened[2] - 1} is never closed"
    return blocks


def url_lines(name: str, lines: list[str], first_line: int = 1) -> list[str]:
    """``name:line: text`` for each line that sets a variable to a PostgreSQL URL."""
    return [
        f"{name}:{number}: {line.strip()}"
        for number, line in enumerate(lines, start=first_line)
        if SETS_URL.search(line)
    ]


def crontab_url_lines(name: str, markdown: str) -> list[str]:
    """The lines of the page's crontabs that set a variable to a PostgreSQL URL."""
    found: list[str] = []
    for block in fenced_blocks(markdown):
        if block.looks_like_a_crontab():
            found += url_lines(name, block.lines, block.first_line)
    return found


def test_no_crontab_in_the_readme_or_the_docs_sets_a_url() -> None:
    found: list[str] = []
    crontabs = 0
    for page in PAGES:
        text = page.read_text()
        crontabs += sum(block.looks_like_a_crontab() for block in fenced_blocks(text))
        found += crontab_url_lines(str(page.relative_to(ROOT)), text)
    assert crontabs >= 5, f"only {crontabs} crontabs found: is the block reader broken?"
    assert not found, (
        "crontabs that put a URL in a variable (README.md: keep it in a user-only file the "
        "job line reads with `.`):\n" + "\n".join(found)
    )


def test_dislock_help_puts_no_url_in_a_variable() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "dislock.cli", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "jobs.env" in shown.stdout, "dislock --help no longer shows README.md's file"
    found = url_lines("dislock --help", shown.stdout.splitlines())
    assert not found, "dislock --help puts a URL in a variable:\n" + "\n".join(found)


LEAKY_PAGE = """\
# A page

```sh
# /etc/dislock/jobs.env: the file itself may hold the URL
set -a
DATABASE_URL=postgresql://u:p@h/db
```

```crontab
DATABASE_URL=postgresql://u:p@h/db
* * * * * echo x
```

```bash
# no language says crontab, the schedule does
LOCK_URL='postgres://u:p@h/db'
@daily . /etc/dislock/jobs.env && echo x
0 3 * * mon-fri SECRET_URL="postgresql://u:p@h/db" dislock SECRET_URL echo x
```
"""


def test_the_checker_flags_a_url_in_a_crontab_and_not_in_the_file() -> None:
    """The negative control: a crontab setting ``DATABASE_URL=postgresql://…`` is caught,
    with its page and line, as are a crontab found by its schedule lines and a URL on a job
    line; the environment file README.md teaches is not."""
    found = crontab_url_lines("leaky.md", LEAKY_PAGE)
    assert found == [
        "leaky.md:10: DATABASE_URL=postgresql://u:p@h/db",
        "leaky.md:16: LOCK_URL='postgres://u:p@h/db'",
        'leaky.md:18: 0 3 * * mon-fri SECRET_URL="postgresql://u:p@h/db" dislock SECRET_URL echo x',
    ]
    help_like = "Put it on a line of its own: DATABASE_URL=postgresql://...  never elsewhere."
    assert url_lines("help", help_like.splitlines()) == [f"help:1: {help_like}"]
    assert not url_lines("help", ["a DATABASE_URL=... line in the file, chmod 600"])
