"""``python -m sensor_task.export ckpt_path=<checkpoint>``: the task declares no export
(``task.export: null``), so the command refuses its checkpoints in one line."""

from ddp_engine.config.command_line import entry_point

from .project import PROJECT

main, cli = entry_point(PROJECT, "export", task="task.export.run", result="output", in_process=True)

if __name__ == "__main__":
    cli()
