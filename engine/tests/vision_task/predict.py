"""``python -m vision_task.predict``: the engine's predict command for the test task."""

from ddp_engine.api import entry_point

from .task import TASK

main, cli = entry_point(TASK, "predict")

if __name__ == "__main__":
    cli()
