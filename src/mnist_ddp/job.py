"""One Hydra job across the DDP processes that Lightning starts for it.

Lightning's DDP strategy (``start_method=popen``) starts each extra process by re-running the
parent's command line. For a single run that works, but under ``-m`` (a Hydra sweep) the
command line is the whole sweep: every child would start the sweep again. So the parent puts
*this job's* overrides and output directory into the environment, which Lightning copies into
each child, and a child runs exactly that job (:func:`ddp_child_argv`), in the same directory,
logging into the same ``<job name>.log`` with its rank in every line (:class:`RankFilter`).

Under torchrun or SLURM every process is started by the launcher with the same command line,
so none of this applies there; what they need instead is a run directory whose name every
process computes alike (:func:`run_stamp`) and a resume after the launcher restarts the job
(:func:`launcher_restarts`).
"""

import json
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime

import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from lightning.fabric.utilities.rank_zero import rank_zero_only

#: Environment variable carrying the job (overrides, output directory) to the DDP children.
JOB_ENV = "MNIST_DDP_JOB"
#: Variables Lightning's subprocess launcher sets in the parent's own environment.
_LAUNCHER_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


@contextmanager
def ddp_job() -> Iterator[None]:
    """Run one Hydra job's fit/test inside this block (in the process Hydra runs the job in).

    On entry, the job is shared with the DDP children Lightning will start. On exit, the
    process group is destroyed and the launcher's environment variables are restored, so that
    the next job of a sweep starts its own processes on a fresh rendezvous port.
    """
    saved = {key: os.environ.get(key) for key in (JOB_ENV, *_LAUNCHER_ENV)}
    hydra_config = HydraConfig.get()
    os.environ[JOB_ENV] = json.dumps(
        {
            "overrides": list(hydra_config.overrides.task),
            "output_dir": hydra_config.runtime.output_dir,
            "name": hydra_config.job.name,
        }
    )
    try:
        yield
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def is_ddp_child(environ: os._Environ | dict) -> bool:
    """Whether this process was started by Lightning's subprocess launcher for a job (see :func:`ddp_job`)."""
    return JOB_ENV in environ and "LOCAL_RANK" in environ


def ddp_child_argv(argv: Sequence[str], environ: os._Environ | dict) -> list[str]:
    """The command line a DDP child (see :func:`is_ddp_child`) runs: its job's overrides, in its job's directory."""
    job = json.loads(environ[JOB_ENV])
    return [
        argv[0],
        *job["overrides"],
        # Quoted: a path may hold characters that Hydra's override grammar reads as syntax.
        f'hydra.run.dir="{job["output_dir"]}"',
        # The parent wrote the job's config; the children must not write it again.
        "hydra.output_subdir=null",
        # The same job name, so the same log file: <output_dir>/<name>.log.
        f"hydra.job.name={job['name']}",
    ]


def run_stamp() -> str:
    """The name of a run's directory (Hydra's ``${run_stamp:}``), the same in every process of it.

    - Under torchrun: ``torchrun-<run id>``, the rendezvous id (``--rdzv-id``; with
      ``--standalone`` a random id per torchrun command). It stays the same when torchrun
      restarts the workers, so the restarted job finds its own checkpoints.
    - Under SLURM (tasks started by ``srun``): ``slurm-<job id>.<step id>``, also unchanged when
      SLURM requeues the job.
    - Otherwise the start time, ``%Y-%m-%d_%H-%M-%S.%f`` (microseconds keep two runs apart); the
      DDP processes Lightning starts itself are given their parent's directory instead.

    Launcher-started processes cannot use the start time: each would get its own.
    """
    if TorchElasticEnvironment.detect():
        return f"torchrun-{os.environ['TORCHELASTIC_RUN_ID']}"
    if SLURMEnvironment.detect():
        return f"slurm-{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '0')}"
    return datetime.now().strftime("%Y-%m-%d_%H-%M-%S.%f")


def launcher_rank() -> int:
    """This process's global rank when torchrun or SLURM started it (``RANK`` / ``SLURM_PROCID``), else 0."""
    for environment in (TorchElasticEnvironment, SLURMEnvironment):
        if environment.detect():
            return environment().global_rank()
    return 0


def launcher_restarts() -> int:
    """How many times the launcher has restarted this job: torchrun's ``TORCHELASTIC_RESTART_COUNT``
    (``--max-restarts``), SLURM's ``SLURM_RESTART_COUNT`` (requeues); 0 otherwise."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or os.environ.get("SLURM_RESTART_COUNT") or 0)


class RankFilter(logging.Filter):
    """Adds ``record.rank``: this process's global rank (0 before the process group exists)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = rank_zero_only.rank
        return True


class RankZeroWarningsFilter(logging.Filter):
    """Drops Python warnings (logger ``py.warnings``) on global ranks other than 0.

    Every DDP process imports the same libraries and runs the same code, so each one would print
    the same deprecation or usage warning: on the console, rank 0's copy is enough. The log file
    keeps every rank's (its handler does not have this filter).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name != "py.warnings" or rank_zero_only.rank == 0
