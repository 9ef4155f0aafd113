"""lta_worker.storage."""
