"""``python -m sensor_task.eval ckpt_path=<checkpoint> [key=value ...]``: tests a checkpoint."""

from ddp_engine.config.command_line import entry_point

from .project import PROJECT

main, cli = entry_point(PROJECT, "eval", task="ddp_engine.run.evaluate:evaluate", result="checkpoint")

if __name__ == "__main__":
    cli()
