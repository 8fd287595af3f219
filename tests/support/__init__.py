"""Test helpers: a PostgreSQL server for the suite, and the drivers of the contract suite."""
