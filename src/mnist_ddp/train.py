"""Entry point: ``python -m mnist_ddp.train [key=value ...]`` (add ``-m`` for a sweep).

Composes the config from ``conf/``, checks the command line, then trains and tests each job on
``trainer.devices`` DDP processes (each runs :func:`ddp_engine.run.train.fit_and_test`) and returns
its best checkpoint's objective (``task.objective``, ``val/acc`` by default: what a sweeper optimizes).
"""

from ddp_engine.config.command_line import entry_point

from mnist_ddp.project import PROJECT

main, cli = entry_point(PROJECT, "config", task="ddp_engine.run.train:fit_and_test")

if __name__ == "__main__":
    cli()
