"""lta_worker.simulator."""
