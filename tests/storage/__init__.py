"""Storage tests: one suite over SQLite always and PostgreSQL when LTA_TEST_DATABASE_URL is set."""
