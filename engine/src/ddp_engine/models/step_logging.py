"""What a LightningModule's training step may ask the engine about its logging: a public name for
it, so that a task's module never reaches into :mod:`ddp_engine.core.compat` (the private APIs)."""

import lightning as L

from ddp_engine.core import compat


def logs_this_step(trainer: L.Trainer) -> bool:
    """Whether the values that this training step logs with ``on_step=True`` reach the loggers:
    every ``trainer.log_every_n_steps`` optimizer steps (all micro-batches of that step) and at a
    stop, never with ``log_every_n_steps=0``; so a metric computed only for the log (a training
    accuracy) can be skipped at the other steps. True at every step where Lightning's rule cannot
    be read (:func:`ddp_engine.core.compat.logs_this_step`)."""
    return compat.logs_this_step(trainer)
