"""Alembic migrations of the lta-worker schema, run programmatically by `storage.migrate`."""
