"""``python -m sensor_task.train [key=value ...]``: trains and tests each job (``-m``: a sweep)."""

from ddp_engine.api import entry_point

from .task import TASK

main, cli = entry_point(TASK, "train")

if __name__ == "__main__":
    cli()
