"""What the entry points do with each job, in every process: train, evaluate."""
