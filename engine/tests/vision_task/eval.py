"""``python -m vision_task.eval``: the engine's eval command for the test task."""

from ddp_engine.api import entry_point

from .task import TASK

main, cli = entry_point(TASK, "eval")

if __name__ == "__main__":
    cli()
