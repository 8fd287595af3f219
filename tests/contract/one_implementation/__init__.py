"""Contract tests that only one implementation, or the SQL itself, can express."""
