"""``python -m mnist_ddp.train [key=value ...]``: trains and tests each job (``-m``: a sweep) on
``trainer.devices`` DDP processes and returns its best checkpoint's objective (what a sweeper optimizes)."""

from ddp_engine.api import entry_point

from mnist_ddp.task import TASK

main, cli = entry_point(TASK, "train")

if __name__ == "__main__":
    cli()
