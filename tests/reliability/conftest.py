"""Fixtures of the reliability tests: a connection to the ledger the workers write."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.support import ledger


@pytest.fixture
def work_db(database_url: str, lock_table: tuple[str, str]) -> Iterator[psycopg.Connection[Any]]:
    """A connection whose search_path is the test's schema, with the ledger in it."""
    schema = lock_table[0]
    with psycopg.connect(database_url, autocommit=True, options=f"-c search_path={schema}") as conn:
        ledger.create(conn)
        yield conn
