"""Heavy work a node cannot carry: a job queue in the store, run by worker processes."""
