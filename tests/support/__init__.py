"""Helpers shared by several test packages (importable as `support.*`)."""

# The schedule the end-to-end harnesses run (the built-in default up to 0.1): every active
# user at `interval`, both endpoints each turn. A test of the default removes the keys.
FIXED_POLL = {"schedule": "fixed", "stats": "always", "interval": "1h"}
