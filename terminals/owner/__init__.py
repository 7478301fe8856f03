"""The owner worker's services (see terminals.worker, the root that composes them)."""
