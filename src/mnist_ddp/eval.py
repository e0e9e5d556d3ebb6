"""Entry point: ``python -m mnist_ddp.eval ckpt_path=<checkpoint> [key=value ...]``.

Tests a checkpoint on its data set's test split with ``trainer.devices`` DDP processes (each runs
:func:`ddp_engine.run.evaluate.evaluate`), on the model and data set of the checkpoint's training
run, and writes its test metrics (``test/loss`` and ``test/acc`` for the classifier) to
``metrics.json`` in its own run directory (``logs/evals/``).
"""

from ddp_engine.config.command_line import entry_point

from mnist_ddp.project import PROJECT

main, cli = entry_point(PROJECT, "eval", task="ddp_engine.run.evaluate:evaluate", result="checkpoint")

if __name__ == "__main__":
    cli()
