"""Entry point: ``python -m mnist_ddp.eval ckpt_path=<checkpoint> [key=value ...]``.

Tests a checkpoint on the official test set with ``trainer.devices`` DDP processes, on the model
and data set of the checkpoint's training run, and writes ``test/loss`` and ``test/acc`` to
``metrics.json`` in its own run directory (``logs/evals/``): :mod:`mnist_ddp.tasks.evaluate` says how.

Like :mod:`mnist_ddp.train`, this module imports Hydra and the config schema only, so that a bad
command line is refused before torch and Lightning are imported.
"""

import hydra
from omegaconf import DictConfig

from mnist_ddp.cli.command_line import run_entry_point
from mnist_ddp.cli.schema import CONFIG_DIR, register_configs
from mnist_ddp.errors import exit_on_usage_error

register_configs()


@hydra.main(config_path=str(CONFIG_DIR), config_name="eval", version_base="1.3")
@exit_on_usage_error
def main(cfg: DictConfig) -> float | None:
    """Test one checkpoint (:func:`mnist_ddp.tasks.evaluate.evaluate_checkpoint`); returns its ``test/acc``."""
    from mnist_ddp.tasks.evaluate import evaluate_checkpoint  # torch and Lightning: see the module's docstring

    return evaluate_checkpoint(cfg)


def cli() -> None:
    """The console script ``mnist-ddp-eval``: the same as ``python -m mnist_ddp.eval``."""
    run_entry_point(main, config_name="eval")


if __name__ == "__main__":
    cli()
