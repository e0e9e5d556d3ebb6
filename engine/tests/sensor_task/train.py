"""``python -m sensor_task.train [key=value ...]``: trains and tests each job (``-m``: a sweep)."""

from ddp_engine.config.command_line import entry_point

from .project import PROJECT

main, cli = entry_point(PROJECT, "config", task="ddp_engine.run.train:fit_and_test")

if __name__ == "__main__":
    cli()
