"""The shared connection's bookkeeping (``dislock.core.hub_state``), followed without a
database: which link is current, whether it came through a crowded door, when it
asks whether it may prepare, the timeline the locks were taken on.

The flavours' ``Hub`` open and retire the links for real in
``contract/test_connection_limits.py`` and ``contract/test_failover.py``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pytest

from dislock.core.hub_state import HubState
from dislock.core.preparing import CHECK_AFTER

URL = "postgresql://jobs:hunter2@db.internal/app"


@dataclass
class Conn:
    prepare_threshold: int | None = None
    info: Any = None


@dataclass
class Link:
    retired: bool = False
    conn: Conn = field(default_factory=Conn)


def hub_through_the_crowd() -> tuple[HubState[Link], Link]:
    """A hub whose current link was opened after refused tries (the hub marks it)."""
    hub: HubState[Link] = HubState(URL, 5.0)
    link = Link()
    hub._adopt(link)
    hub._crowded_link = link
    return hub, link


def test_a_new_hub_has_no_user_no_link_and_no_crowd() -> None:
    hub: HubState[Link] = HubState(URL, 5.0)
    assert (hub.users, hub.timeline, hub.crowded) == (0, None, False)


def test_only_the_first_statement_on_a_link_opened_through_a_crowd_is_crowded() -> None:
    hub, link = hub_through_the_crowd()
    assert hub.crowded
    hub._check_due(link)  # the first statement was sent
    assert not hub.crowded


def test_a_link_opened_at_the_first_try_is_not_crowded() -> None:
    hub, _ = hub_through_the_crowd()
    hub._adopt(Link())  # opened since, without refusals
    assert not hub.crowded


def test_a_retired_or_forgotten_crowded_link_is_not_crowded() -> None:
    hub, link = hub_through_the_crowd()
    link.retired = True
    assert not hub.crowded
    hub, link = hub_through_the_crowd()
    hub._forget(link)
    assert not hub.crowded


def test_a_link_forgets_only_itself() -> None:
    """A link another thread just opened stays current."""
    hub, link = hub_through_the_crowd()
    hub._forget(Link())
    assert hub.crowded
    hub._forget(link)
    assert hub._link is None


def test_a_link_counted_by_another_link_is_not_crowded() -> None:
    hub, link = hub_through_the_crowd()
    other = Link()
    hub._preparation = (other, hub._preparation[1])  # type: ignore[index]
    assert not hub.crowded
    assert hub._check_due(link) is False


def test_the_preparation_check_is_due_once_after_enough_statements_on_the_link() -> None:
    hub, link = hub_through_the_crowd()
    due = [hub._check_due(link) for _ in range(CHECK_AFTER + 3)]
    assert due == [False] * (CHECK_AFTER - 1) + [True] + [False] * 3
    unused: HubState[Link] = HubState(URL, 5.0)
    assert unused._check_due(link) is False  # no link adopted: nothing counted


def test_a_link_prepares_only_when_the_server_is_the_one_it_announced() -> None:
    hub, link = hub_through_the_crowd()
    link.conn.info = type("Info", (), {"backend_pid": 42})()
    hub._prepare_if_direct(link, 42)
    assert link.conn.prepare_threshold is not None
    hub._prepare_if_direct(link, 43)  # a pooler in between
    assert link.conn.prepare_threshold is None


def test_a_lost_prepared_statement_stops_preparing_and_says_so_without_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hub, link = hub_through_the_crowd()
    link.conn = Conn(prepare_threshold=5)
    with caplog.at_level(logging.WARNING, logger="dislock"):
        hub._stop_preparing(link, RuntimeError(f"prepared statement lost on {URL}"))
    assert link.conn.prepare_threshold is None
    assert "stay unprepared" in caplog.text and "hunter2" not in caplog.text


def test_the_timeline_is_noted_only_when_known_and_a_change_is_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hub: HubState[Link] = HubState(URL, 5.0)
    hub.note_timeline(None)
    hub.note_timeline(3)
    hub.note_timeline("4")
    noted = hub.timeline
    with caplog.at_level(logging.WARNING, logger="dislock"):
        hub._timeline_read(3)
        assert caplog.text == ""
        hub._timeline_read(4)
    assert (noted, hub.timeline) == (3, 4)
    assert "reconnected to a server on timeline 4" in caplog.text
