"""What the history keeps of a command's output (``dislock.core.output_tail.Tail``):
bounded, inert, and no part of the lock URL's password, wherever the cut falls."""

from __future__ import annotations

import pytest

from dislock.core import dsn
from dislock.core.output_tail import Tail

URL = "postgresql://jobs:Passw0rdXYZ@db.example:5432/locks"
PASSWORD = "Passw0rdXYZ"


def fed(tail: Tail, data: bytes, chunk: int = 7) -> str | None:
    for start in range(0, len(data), chunk):
        tail.feed(data[start : start + chunk])
    return tail.text()


def no_part_of_the_password(text: str) -> bool:
    return not any(PASSWORD[i:] in text for i in range(len(PASSWORD) - 2))


def test_no_fragment_of_a_secret_survives_the_cut() -> None:
    # The cut falls anywhere in a URL: after scrubbing, what is left of the front of
    # the buffer could otherwise slide into the tail.
    for shift in range(len(URL) + 1):
        output = ("x" * shift + f"connecting to {URL}\n" * 40).encode()
        text = fed(Tail(40, URL), output)
        assert text is not None and len(text) <= 40
        assert no_part_of_the_password(text), (shift, text)
    # Characters of several bytes after the URL: fewer characters than bytes kept.
    text = fed(Tail(63, URL), (f"{URL}" + "é" * 63).encode(), chunk=5)
    assert text == "é" * 63
    assert fed(Tail(100, URL), f"a short one: {URL}\n".encode()) == "a short one: ***\n"
    # The password alone, too, glued to other text or percent-encoded.
    assert fed(Tail(100, URL), f"pw={PASSWORD} not{PASSWORD}s\n".encode()) == "pw=*** not***s\n"


def test_no_fragment_of_a_percent_encoded_secret_survives_the_cut() -> None:
    # Encoded, a secret is up to three times as long as the URL writes it.
    url = "password=" + "/" * 20
    encoded = "%2f" * 20
    for shift in range(len(encoded) + 1):
        text = fed(Tail(40, url), ("x" * shift + f"pw {encoded}\n" * 10).encode())
        assert text is not None and "%2f%2f" not in text, (shift, text)


def test_a_password_beside_the_url_is_scrubbed_however_the_cut_falls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # PGPASSWORD with a URL that has no password, or no URL at all (libpq's defaults).
    monkeypatch.setattr(dsn, "_USED", set())
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    for url in ("postgresql://jobs@db.example/locks", ""):
        for shift in range(len(PASSWORD) + 1):
            text = fed(Tail(40, url), ("x" * shift + f"pw {PASSWORD}\n" * 10).encode())
            assert text is not None and no_part_of_the_password(text), (url, shift, text)
        assert fed(Tail(100, url), f"pw={PASSWORD}\n".encode()) == "pw=***\n"


def test_bytes_that_are_not_text_are_kept_as_escapes() -> None:
    text = fed(Tail(100), b"a\x00b\xff\x1b[31mred\n")
    assert text == "a\\x00b\\xff\x1b[31mred\n"
    assert Tail(10).text() is None
    assert fed(Tail(4), b"0123456789") == "6789"


class _Lease:
    def __init__(self, lost: bool) -> None:
        self.lost = lost

    def is_lost(self) -> bool:
        return self.lost


class _Run:
    def __init__(self, end: object, lost: bool) -> None:
        self.lease = _Lease(lost)
        self.run_end = end


def test_a_success_keeps_no_tail_and_one_whose_lease_went_as_it_ended_keeps_it() -> None:
    """How a wrapped command's end is recorded (``_recording.run_end``): the wrapper
    hands over its tails whatever the outcome."""
    from dislock._sync._recording import run_end
    from dislock.core.context import LockContext
    from dislock.core.history import RunEnd

    context = LockContext(
        url="postgresql://db/app", lock_key="k", run_ttl_seconds=10, lease_interval_seconds=2
    )
    ended = RunEnd("ok", 0, stdout_tail="done\n", stderr_tail="")
    kept = run_end(context, _Run(ended, lost=False), None)  # type: ignore[arg-type]
    assert kept == RunEnd("ok", 0)
    lost = run_end(context, _Run(ended, lost=True), None)  # type: ignore[arg-type]
    assert lost == RunEnd("lease_lost", 75, stdout_tail="done\n", stderr_tail="")
    failed = RunEnd("failed", 3, stdout_tail="oops\n", stderr_tail=None)
    assert run_end(context, _Run(failed, lost=False), None) == failed  # type: ignore[arg-type]


def test_history_shows_a_long_lines_end_and_the_last_lines() -> None:
    from dislock.cli.runs.history_report import TAIL_LINE_CHARS, TAIL_LINES, shown_tail

    long = "x" * 5000 + "disk full"
    lines, cut = shown_tail(f"{long}\n")
    assert not cut and len(lines) == 1
    assert len(lines[0]) == TAIL_LINE_CHARS and lines[0].startswith("…")
    assert lines[0].endswith("xdisk full")
    many = "".join(f"line {n}\x1b\n" for n in range(100))
    lines, cut = shown_tail(many)
    assert cut and len(lines) == TAIL_LINES and lines[-1] == "line 99\\x1b", lines[-1]
