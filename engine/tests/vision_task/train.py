"""``python -m vision_task.train``: the engine's train command for the test task."""

from ddp_engine.api import entry_point

from .task import TASK

main, cli = entry_point(TASK, "train")

if __name__ == "__main__":
    cli()
