"""Entry point: ``python -m mnist_ddp.export ckpt_path=<checkpoint> format=onnx|torch_export [output=<file>]``.

Writes the checkpoint's network, with its training run's normalization inside, as an ONNX model or
a ``torch.export`` program (by default beside the checkpoint: ``<stem>.onnx`` / ``<stem>.pt2``),
never over an existing file, and checks that the file computes the checkpoint's logits on 64 test
images: :mod:`mnist_ddp.tasks.export` says how, and what the exported model takes and returns.
One process; its run directory (``logs/exports/``) keeps its config, log and ``metrics.json``.

Like :mod:`mnist_ddp.train`, this module imports Hydra and the config schema only, so that a bad
command line is refused before torch and Lightning are imported.
"""

import hydra
from omegaconf import DictConfig

from mnist_ddp.cli.command_line import run_entry_point
from mnist_ddp.cli.schema import CONFIG_DIR, register_configs
from mnist_ddp.errors import exit_on_usage_error

register_configs()


@hydra.main(config_path=str(CONFIG_DIR), config_name="export", version_base="1.3")
@exit_on_usage_error
def main(cfg: DictConfig) -> str:
    """Export one checkpoint (:func:`mnist_ddp.tasks.export.export_checkpoint`); returns the file's path."""
    from mnist_ddp.tasks.export import export_checkpoint  # torch and Lightning: see the module's docstring

    return export_checkpoint(cfg)["output"]


def cli() -> None:
    """The console script ``mnist-ddp-export``: the same as ``python -m mnist_ddp.export``."""
    run_entry_point(main, config_name="export")


if __name__ == "__main__":
    cli()
