"""``python -m mnist_ddp.eval ckpt_path=<checkpoint> [key=value ...]``: tests a checkpoint on its
run's test split with ``trainer.devices`` DDP processes, and writes its metrics to ``metrics.json``."""

from ddp_engine.api import entry_point

from mnist_ddp.task import TASK

main, cli = entry_point(TASK, "eval")

if __name__ == "__main__":
    cli()
