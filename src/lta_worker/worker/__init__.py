"""lta_worker.worker."""
