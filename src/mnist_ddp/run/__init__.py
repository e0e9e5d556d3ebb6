"""What one process of a job does: build the Trainer, then train, evaluate, predict or export."""
