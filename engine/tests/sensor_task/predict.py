"""``python -m sensor_task.predict ckpt_path=<checkpoint> input=<file>``: the task declares no
predict (``task.predict: null``), so the command refuses its checkpoints in one line."""

from ddp_engine.api import entry_point

from .task import TASK

main, cli = entry_point(TASK, "predict")

if __name__ == "__main__":
    cli()
