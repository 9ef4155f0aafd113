"""Helpers shared by several test packages (importable as `support.*`)."""
