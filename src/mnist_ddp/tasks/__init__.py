"""What the entry points do with each job: train, evaluate, predict (in every process), export (in one)."""
