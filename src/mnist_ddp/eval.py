"""Entry point: ``python -m mnist_ddp.eval ckpt_path=<checkpoint> [key=value ...]``.

Tests a checkpoint on its data set's test split with ``trainer.devices`` DDP processes (each runs
:func:`mnist_ddp.run.evaluate.evaluate`), on the model and data set of the checkpoint's training
run, and writes its test metrics (``test/loss`` and ``test/acc`` for the classifier) to
``metrics.json`` in its own run directory (``logs/evals/``).
"""

from mnist_ddp.config.command_line import entry_point

main, cli = entry_point("eval", task="mnist_ddp.run.evaluate:evaluate", result="checkpoint")

if __name__ == "__main__":
    cli()
