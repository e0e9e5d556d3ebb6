"""``python -m vision_task.export``: the engine's export command for the test task."""

from ddp_engine.api import entry_point

from .task import TASK

main, cli = entry_point(TASK, "export")

if __name__ == "__main__":
    cli()
