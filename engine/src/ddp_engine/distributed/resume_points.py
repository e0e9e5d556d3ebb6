"""Which checkpoint of a run a resume continues from, and at which global step: read with torch
alone, so that the supervisor, which imports no Lightning, names it in a stop's or a failure's line."""

from pathlib import Path

import torch

from ddp_engine.core.run_dir import LAST_CHECKPOINT


def resume_point(run_dir: Path | str) -> Path | None:
    """The checkpoint a resume in place of the run in ``run_dir`` continues from: the one of its
    ``checkpoints/*.ckpt`` saved at the highest global step (``last.ckpt`` among equals), skipping
    any that cannot be read as one; None where there is none. Usually ``last.ckpt``; an epoch's
    checkpoint where a later ``last.ckpt`` could not be written (a full disk) or its callback was off."""
    steps = {path: saved_global_step(path) for path in (Path(run_dir) / LAST_CHECKPOINT.parent).glob("*.ckpt")}
    complete = [(step, path.name == LAST_CHECKPOINT.name, path) for path, step in steps.items() if step is not None]
    return max(complete)[2] if complete else None


def in_place_resume_step(run_dir: Path, ckpt_path: str | None) -> int | None:
    """The global step of the run's :func:`resume_point` when this job resumes it in place
    (``ckpt_path=last`` and the run has one), else None.

    TensorBoard's ``purge_step``: the run's event files keep their points before this step, and
    the points the killed run logged after its last checkpoint are dropped, since the resumed run
    logs those steps again.
    """
    path = resume_point(run_dir) if ckpt_path == "last" else None
    return None if path is None else saved_global_step(path)


def with_global_step(path: Path) -> str:
    """``path`` and the global step it was saved at, as a stop's or a failure's line names the
    checkpoint that a resume continues from (``.../last.ckpt (global step 430)``), so that the steps
    the resume trains again show; ``path`` alone where the file cannot be read as a checkpoint."""
    step = saved_global_step(path)
    return str(path) if step is None else f"{path} (global step {step})"


def saved_global_step(path: Path) -> int | None:
    """The global step (optimizer steps) at which the checkpoint ``path`` was saved, read through a
    memory map, so that none of its tensors is read; None where the file cannot be read as one."""
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["global_step"])
    except Exception:  # whatever a corrupt or foreign file makes the unpickler raise
        return None
