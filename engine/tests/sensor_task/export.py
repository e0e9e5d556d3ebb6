"""``python -m sensor_task.export ckpt_path=<checkpoint>``: the task declares no export
(``task.export: null``), so the command refuses its checkpoints in one line."""

from ddp_engine.api import entry_point

from .task import TASK

main, cli = entry_point(TASK, "export")

if __name__ == "__main__":
    cli()
