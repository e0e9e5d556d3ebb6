"""The launcher that started this process: torchrun (TorchElastic), SLURM, or none (the template's
own supervisor, or a plain ``python``); and whether it runs in a Kubeflow TrainJob's pod, under torchrun.

The one place that asks: every other module calls :func:`external_launcher` or a function here.
Lightning's cluster environments do the detection (``TorchElasticEnvironment.detect()``,
``SLURMEnvironment.detect()``), in the order Lightning's own connector tries them. Lightning is
imported inside the functions: the command line is checked before it, with Hydra alone.
"""

import os
import signal
from datetime import datetime
from typing import Any


def external_launcher() -> Any | None:
    """The Lightning cluster environment class of the launcher that started this process
    (``TorchElasticEnvironment`` under torchrun, ``SLURMEnvironment`` under ``srun``), or None."""
    if not launched_externally():  # the same answer, without importing Lightning (seconds)
        return None
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    for environment in (TorchElasticEnvironment, SLURMEnvironment):
        if environment.detect():
            return environment
    return None


def launched_externally() -> bool:
    """Whether torchrun or SLURM started this process: then it is a worker, and runs the job itself.

    The answer of :func:`external_launcher`, from the variables its two ``detect()`` read (torch's
    ``is_torchelastic_launched``: ``TORCHELASTIC_RUN_ID``; Lightning's ``_is_srun_used``:
    ``SLURM_NTASKS`` unless ``SLURM_JOB_NAME`` is ``bash`` or ``interactive``), without importing
    Lightning (2.6 s to import): the command asks while it checks the command line, before it
    needs Lightning. ``engine/tests/core/test_environment.py`` checks that the two agree.
    """
    torchelastic = "TORCHELASTIC_RUN_ID" in os.environ
    srun = "SLURM_NTASKS" in os.environ and os.environ.get("SLURM_JOB_NAME") not in ("bash", "interactive")
    return torchelastic or srun


def launcher_rank() -> int:
    """This process's global rank when torchrun or SLURM started it (``RANK`` / ``SLURM_PROCID``), else 0."""
    environment = external_launcher()
    return environment().global_rank() if environment is not None else 0


#: Set by the manifest of a Kubeflow TrainJob (``launcher=kubeflow``) in each of its pods: the TrainJob's name.
TRAINJOB_ENV = "DDP_ENGINE_TRAINJOB"


def launcher_restarts() -> int:
    """How many times the launcher has restarted this job: torchrun's ``TORCHELASTIC_RESTART_COUNT``
    (``--max-restarts``), SLURM's ``SLURM_RESTART_COUNT`` (requeues); 0 otherwise."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or os.environ.get("SLURM_RESTART_COUNT") or 0)


def trainjob_name() -> str | None:
    """The name of the Kubeflow TrainJob whose pod runs this process (its manifest sets it), or None."""
    return os.environ.get(TRAINJOB_ENV)


def resumes_in_place() -> bool:
    """Whether this job continues the run its directory holds, if any, instead of refusing it: after
    its launcher restarted it (:func:`launcher_restarts`), and in every pod of a Kubeflow TrainJob,
    which Kubernetes starts afresh on a restart (torchrun's count is 0 again) with the same run
    directory (:func:`run_stamp`)."""
    return launcher_restarts() > 0 or trainjob_name() is not None


def run_stamp() -> str:
    """The name of a run's directory (Hydra's ``${run_stamp:}``), the same in every process of it.

    - Under torchrun: ``torchrun-<run id>``, the rendezvous id (``--rdzv-id``; with
      ``--standalone`` a random id per torchrun command). It stays the same when torchrun
      restarts the workers, so the restarted job finds its own checkpoints.
    - In a Kubeflow TrainJob's pod (under torchrun): ``trainjob-<its name>``, the same for every pod
      and every restart of one, as no ``PET_*`` variable names the job.
    - Under SLURM (tasks started by ``srun``): ``slurm-<job id>.<step id>``, also unchanged when
      SLURM requeues the job.
    - Otherwise the start time, ``%Y-%m-%d_%H-%M-%S.%f`` (microseconds keep two runs apart); the
      worker processes read their job's directory from the job file instead.

    Launcher-started processes cannot use the start time: each would get its own.
    """
    environment = external_launcher()
    if environment is None:
        return datetime.now().strftime("%Y-%m-%d_%H-%M-%S.%f")
    if environment.__name__ == "TorchElasticEnvironment":
        if (trainjob := trainjob_name()) is not None:
            return f"trainjob-{trainjob}"
        return f"torchrun-{os.environ['TORCHELASTIC_RUN_ID']}"
    return f"slurm-{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '0')}"


#: Set by submitit in every task it starts (``slurm``, or ``local`` for its local executor).
SUBMITIT_EXECUTOR_ENV = "SUBMITIT_EXECUTOR"


def submitit_preempt_signal() -> signal.Signals | None:
    """The signal submitit asks SLURM to send before a preemption or time limit (``#SBATCH
    --signal=USR2@<delay>``; ``SUBMITIT_PREEMPT_SIGNAL`` changes it), when submitit started this
    process (``hydra/launcher=slurm``); None otherwise. The template's requeue then acts on it
    instead of SLURM's usual SIGUSR1 (:class:`ddp_engine.callbacks.signals.RequeueOnSlurmSignal`)."""
    if SUBMITIT_EXECUTOR_ENV not in os.environ:
        return None
    from submitit import JobEnvironment  # installed: it started this process

    return signal.Signals[f"SIG{JobEnvironment.USR_SIG}"]
