"""Entry point: ``python -m mnist_ddp.train [key=value ...]`` (add ``-m`` for a sweep).

Composes the config from ``conf/``, checks the command line, then trains and tests each job on
``trainer.devices`` DDP processes (each runs :func:`mnist_ddp.run.train.fit_and_test`) and returns
its best checkpoint's objective (``task.objective``, ``val/acc`` by default: what a sweeper optimizes).
"""

from mnist_ddp.config.command_line import entry_point

main, cli = entry_point("config", task="mnist_ddp.run.train:fit_and_test")

if __name__ == "__main__":
    cli()
