"""``python -m sensor_task.eval ckpt_path=<checkpoint> [key=value ...]``: tests a checkpoint."""

from ddp_engine.api import entry_point

from .task import TASK

main, cli = entry_point(TASK, "eval")

if __name__ == "__main__":
    cli()
