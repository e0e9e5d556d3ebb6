"""The command line: the config schema, the checks before launch, building the Trainer, running a
Hydra job, resuming in place, and the sweep summary."""
