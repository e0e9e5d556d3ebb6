"""The run directory's name, and the files a job writes into it besides Lightning's own."""

import csv
import hashlib
import io
import json
import os
import secrets
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path

from omegaconf import DictConfig, OmegaConf


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: into a temporary ``.<name>.<random>.partial`` beside it,
    then renamed over it, so that a reader, or a kill during the write, sees the old file or the
    whole new one, and processes writing the same file at once do not write into each other's."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Named by process and at random (not mkstemp, whose files are private to their owner).
    partial = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` to ``path`` as JSON, atomically (:func:`write_atomically`)."""
    write_atomically(path, json.dumps(data, indent=2) + "\n")


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    """Write a CSV file (``header``, then ``rows``; Python's ``csv`` dialect ``excel``), atomically
    (:func:`write_atomically`)."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    write_atomically(path, text.getvalue())


def config_fingerprint(cfg: DictConfig) -> str:
    """First 12 hex digits of the SHA-256 of the resolved config as YAML: equal on every rank of a job."""
    return hashlib.sha256(OmegaConf.to_yaml(cfg, resolve=True).encode()).hexdigest()[:12]


def run_stamp() -> str:
    """The name of a run's directory (Hydra's ``${run_stamp:}``), the same in every process of it.

    - Under torchrun: ``torchrun-<run id>``, the rendezvous id (``--rdzv-id``; with
      ``--standalone`` a random id per torchrun command). It stays the same when torchrun
      restarts the workers, so the restarted job finds its own checkpoints.
    - Under SLURM (tasks started by ``srun``): ``slurm-<job id>.<step id>``, also unchanged when
      SLURM requeues the job.
    - Otherwise the start time, ``%Y-%m-%d_%H-%M-%S.%f`` (microseconds keep two runs apart); the
      worker processes read their job's directory from the job file instead.

    Launcher-started processes cannot use the start time: each would get its own.
    """
    # Lightning (seconds to import) only when Hydra names a run directory: the command line's keys
    # are checked before, with the schema alone (mnist_ddp.cli.compose).
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    if TorchElasticEnvironment.detect():
        return f"torchrun-{os.environ['TORCHELASTIC_RUN_ID']}"
    if SLURMEnvironment.detect():
        return f"slurm-{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '0')}"
    return datetime.now().strftime("%Y-%m-%d_%H-%M-%S.%f")
