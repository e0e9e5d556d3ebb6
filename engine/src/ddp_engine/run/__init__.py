"""What one process of a job does: build the Trainer, then train or evaluate (a task's own commands,
such as predict and export, are the task's)."""
