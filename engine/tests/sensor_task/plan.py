"""``python -m sensor_task.plan [training overrides]``: the engine's plan of a training's layout for the test task."""

from ddp_engine.api import entry_point

from .task import TASK

main, cli = entry_point(TASK, "plan")

if __name__ == "__main__":
    cli()
