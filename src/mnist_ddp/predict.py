"""Entry point: ``python -m mnist_ddp.predict ckpt_path=<checkpoint> input=<folder or IDX file> [key=value ...]``.

Predicts the class of every input (a folder of PNG or JPEG images, one image, or an IDX images
file) with ``trainer.devices`` DDP processes, each input exactly once, on the model and
normalization of the checkpoint's training run, and writes ``predictions.csv`` (one row per input,
in input order) into its own run directory (``logs/predictions/``):
:mod:`mnist_ddp.run.predict` says how.

Like :mod:`mnist_ddp.train`, this module imports Hydra and the config schema only, so that a bad
command line is refused before torch and Lightning are imported.
"""

from ddp_engine.config.command_line import entry_point

from mnist_ddp.project import PROJECT

main, cli = entry_point(PROJECT, "predict", task="task.predict.run", result="predictions")

if __name__ == "__main__":
    cli()
