"""Entry point: ``python -m mnist_ddp.train [key=value ...]`` (add ``-m`` for a sweep).

Composes the config from ``conf/``, checks the command line
(:func:`mnist_ddp.cli.command_line.run_entry_point`), then trains and tests each job on
``trainer.devices`` DDP processes: :mod:`mnist_ddp.tasks.train` says how.

This module imports Hydra and the config schema only. torch and Lightning, which take seconds to
import, come after the command line's keys are checked, so that a typo is refused in about a second.
"""

import hydra
from omegaconf import DictConfig

from mnist_ddp.cli.command_line import run_entry_point
from mnist_ddp.cli.schema import CONFIG_DIR, register_configs
from mnist_ddp.errors import exit_on_usage_error

register_configs()


@hydra.main(config_path=str(CONFIG_DIR), config_name="config", version_base="1.3")
@exit_on_usage_error
def main(cfg: DictConfig) -> float | None:
    """Train and test one job (:func:`mnist_ddp.tasks.train.train`); returns its best ``val/acc``."""
    from mnist_ddp.tasks.train import train  # torch and Lightning: see the module's docstring

    return train(cfg)


def cli() -> None:
    """The console script ``mnist-ddp-train``: the same as ``python -m mnist_ddp.train``."""
    run_entry_point(main, config_name="config")


if __name__ == "__main__":
    cli()
