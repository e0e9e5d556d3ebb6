"""A run directory as the template leaves it: the job's metrics file and status, its last checkpoint,
and the command that resumes it; a checkpoint path that names no file."""

import json
import os
import shlex
import sys
from pathlib import Path

from ddp_engine.core.errors import CheckpointError
from ddp_engine.task import current

#: The metrics file of a job, in its run directory: the task's metrics, the job's overrides and its status.
METRICS_FILE = "metrics.json"
#: Set by a sweep's launcher for its jobs' processes: the sweep's directory (a job resumes by continuing it).
SWEEP_DIR_ENV = "DDP_ENGINE_SWEEP_DIR"


def check_checkpoint_file(path: str | Path, key: str = "ckpt_path") -> None:
    """Refuse a ``key`` (a config key) whose ``path`` is not a file: what a checkpoint's check
    needs no torch for, so that the command refuses it before it imports torch and Lightning;
    :func:`ddp_engine.distributed.checkpoint_io.check_checkpoint` then reads the file.

    Raises:
        CheckpointError: when ``path`` is a folder or does not exist.
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(
            f"{key}={path} is a folder. Pass a .ckpt file, such as {path}/checkpoints/last.ckpt of a run's directory."
        )
    if not path.is_file():
        raise CheckpointError(f"{key}={path}: no such file. Pass a .ckpt file from a run's checkpoints/ folder.")


def resume_command(run_dir: Path | str) -> str:
    """The command that resumes the run in ``run_dir`` in place, ready to paste into a shell: with
    this process's Python interpreter (the project's ``.venv/bin/python`` when the run was started
    from it; a bare ``python`` would be whichever is first on ``PATH``, often one without the project)."""
    command = f"{shlex.quote(sys.executable)} -m {current().package}.train"
    return f"{command} hydra.run.dir={shlex.quote(str(run_dir))} ckpt_path=last"


def resume_hint(run_dir: Path | str) -> str:
    """How to resume the run in ``run_dir``, as a sentence: in place (:func:`resume_command`), or,
    for a job of a sweep (:data:`SWEEP_DIR_ENV`), by continuing its sweep, which resumes it with the rest."""
    if sweep_dir := os.environ.get(SWEEP_DIR_ENV):
        return f"Continue its sweep with the same command and hydra.sweep.dir={sweep_dir}, which resumes it."
    return f"Resume this run in place with: {resume_command(run_dir)}"


def restart_hint(run_dir: Path | str) -> str:
    """How to start the run in ``run_dir`` again when it stopped before its first checkpoint, as a
    sentence: there is nothing to resume, and a new run there is refused (it would overwrite the
    logs and metrics that say why it stopped). A job of a sweep (:data:`SWEEP_DIR_ENV`) starts
    again when its sweep is continued, its outputs moved aside."""
    if sweep_dir := os.environ.get(SWEEP_DIR_ENV):
        return f"Continue its sweep with the same command and hydra.sweep.dir={sweep_dir}, which starts it again."
    return (
        "There is nothing to resume: start it again in another directory (hydra.run.dir=<new folder>, or leave "
        f"hydra.run.dir unset for a fresh one), or move {run_dir} away first."
    )


#: A run's newest checkpoint, relative to its run directory (``LastCheckpoint``'s ``last.ckpt``).
LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"


def read_metrics(run_dir: Path) -> dict:
    """``run_dir``'s :data:`METRICS_FILE`; empty where there is none, or it cannot be read (a run
    killed before it wrote one: the file is written atomically, so it is whole or absent)."""
    try:
        metrics = json.loads((Path(run_dir) / METRICS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return metrics if isinstance(metrics, dict) else {}


def run_status(run_dir: Path) -> str | None:
    """The status that ``run_dir``'s :data:`METRICS_FILE` records: ``completed``, ``failed`` or
    ``stopped`` (by a signal); None where there is none (:func:`read_metrics`)."""
    return read_metrics(run_dir).get("status")
