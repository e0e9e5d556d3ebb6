"""Entry point: ``python -m mnist_ddp.predict ckpt_path=<checkpoint> input=<folder or IDX file> [key=value ...]``.

Predicts the class of every input (a folder of PNG or JPEG images, one image, or an IDX images
file) with ``trainer.devices`` DDP processes, each input exactly once, on the model and
normalization of the checkpoint's training run, and writes ``predictions.csv`` (one row per input,
in input order) into its own run directory (``logs/predictions/``):
:mod:`mnist_ddp.tasks.predict` says how.

Like :mod:`mnist_ddp.train`, this module imports Hydra and the config schema only, so that a bad
command line is refused before torch and Lightning are imported.
"""

import hydra
from omegaconf import DictConfig

from mnist_ddp.cli.command_line import run_entry_point
from mnist_ddp.cli.schema import CONFIG_DIR, register_configs
from mnist_ddp.errors import exit_on_usage_error

register_configs()


@hydra.main(config_path=str(CONFIG_DIR), config_name="predict", version_base="1.3")
@exit_on_usage_error
def main(cfg: DictConfig) -> str | None:
    """Predict one job's inputs (:func:`mnist_ddp.tasks.predict.predict_inputs`); returns the CSV's path."""
    from mnist_ddp.tasks.predict import predict_inputs  # torch and Lightning: see the module's docstring

    return predict_inputs(cfg)


def cli() -> None:
    """The console script ``mnist-ddp-predict``: the same as ``python -m mnist_ddp.predict``."""
    run_entry_point(main, config_name="predict")


if __name__ == "__main__":
    cli()
