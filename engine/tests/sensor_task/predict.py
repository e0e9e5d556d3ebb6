"""``python -m sensor_task.predict ckpt_path=<checkpoint> input=<file>``: the task declares no
predict (``task.predict: null``), so the command refuses its checkpoints in one line."""

from ddp_engine.config.command_line import entry_point

from .project import PROJECT

main, cli = entry_point(PROJECT, "predict", task="task.predict.run", result="predictions")

if __name__ == "__main__":
    cli()
