"""The Hydra launchers of SLURM sweeps (``hydra/launcher=slurm``): hydra-submitit-launcher's, which
submits each job of a ``-m`` sweep as one SLURM job (one task of a job array), planned first as a
continued sweep plans its jobs (:func:`ddp_engine.launch.sweep_launcher.plan_jobs`).

Each SLURM job has one task per DDP process (``tasks_per_node = trainer.devices`` on each of
``nodes = trainer.num_nodes``): SLURM starts the ranks, and each runs the job as under ``srun`` in
``slurm/train.sbatch`` (Lightning's SLURMEnvironment; :func:`ddp_engine.launch.job.run_job`, run
by submitit's ``python -m submitit.core._submit`` instead of the command line). Lightning's own
launcher never starts processes there, so the DDP-in-submitit breakage of hydra#2231 does not arise.

Preemption: submitit has SLURM send SIGUSR2 (``#SBATCH --signal=USR2@<signal_delay_s>``), not the
SIGUSR1 of ``slurm/train.sbatch``. The template's requeue acts on that signal instead (its handler
replaces submitit's: :class:`ddp_engine.callbacks.signals.RequeueOnSlurmSignal`): every rank saves
``last.ckpt`` at the next optimizer step, rank 0 runs ``scontrol requeue`` once, the requeued job
runs the same submission in the same job directory and resumes from ``last.ckpt``.

The same sweep command again with ``hydra.sweep.dir=<that sweep>`` continues a sweep as
``hydra/launcher=resumable`` does (completed jobs kept, interrupted ones resumed, ...), once no job
of it is still queued or running on the cluster.

``hydra/launcher=slurm_local`` runs the same on this machine with submitit's local executor (no
SLURM, no requeue), through :func:`slurm_variables_of_local_task`.
"""

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, setup_globals
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import (
    BaseSubmititLauncher,
    LocalLauncher,
    SlurmLauncher,
)
from omegaconf import DictConfig, OmegaConf, open_dict
from typing_extensions import override

from ddp_engine.core.compat import submitit_sbatch_script
from ddp_engine.core.environment import SUBMITIT_EXECUTOR_ENV, launcher_rank
from ddp_engine.core.errors import ConfigValueError
from ddp_engine.core.files import write_json
from ddp_engine.core.lifetime import stop_with_process
from ddp_engine.core.run_dir import METRICS_FILE, SWEEP_DIR_ENV, read_metrics
from ddp_engine.launch.sweep_launcher import PlannedJob, hold_sweep, job_return, plan_jobs

log = logging.getLogger(__name__)


class SubmititSweep(BaseSubmititLauncher):
    """hydra-submitit-launcher's launcher, which also continues a sweep (base of :class:`SlurmSweepLauncher`
    and :class:`LocalSlurmSweepLauncher`).

    Args:
        rerun_failed: run the jobs that failed again when the sweep is continued (default False),
            as :class:`~ddp_engine.launch.sweep_launcher.ResumableLauncher` does.
        params: hydra-submitit-launcher's keys (``ddp_engine/conf/hydra/launcher/slurm.yaml`` lists them).
            ``gpus_per_node: null`` is ``tasks_per_node`` when ``trainer.accelerator`` is a GPU
            one (``gpu``, ``cuda``), else none.

    Raises:
        ConfigValueError: at launch, for a ``tasks_per_node`` that is not a number
            (``trainer.devices=auto``: SLURM needs the count).
    """

    #: submitit's executor: ``slurm`` or ``local`` (hydra-submitit-launcher's own name for it is private).
    cluster = "slurm"

    def __init__(self, rerun_failed: bool = False, **params: Any) -> None:
        super().__init__(**params)
        self.rerun_failed = rerun_failed

    def job_config(self, overrides: list[str], index: int) -> DictConfig:
        """The config of job number ``index`` with ``overrides``, as each submitted job composes it."""
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(config):
            config.hydra.job.num = index
        return config

    def executor(self) -> Any:
        """submitit's executor of this launcher's keys, as hydra-submitit-launcher builds it."""
        import submitit

        params = {key: value for key, value in self.params.items() if value is not None}  # null: submitit's default
        if not isinstance(params["tasks_per_node"], int):
            raise ConfigValueError(
                f"hydra.launcher.tasks_per_node={params['tasks_per_node']} (trainer.devices): a SLURM job needs the "
                "number of processes per node. Set trainer.devices=<GPUs per node> (or processes per CPU node)."
            )
        if "gpus_per_node" not in params and str(self.config.trainer.accelerator) in ("gpu", "cuda"):
            params["gpus_per_node"] = params["tasks_per_node"]
        init = {"folder": params.pop("submitit_folder")}
        if "max_num_timeout" in params:
            init[f"{self.cluster}_max_num_timeout"] = params.pop("max_num_timeout")
        executor = submitit.AutoExecutor(cluster=self.cluster, **init)
        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{key if key in shared else f"{self.cluster}_{key}": value
                                      for key, value in params.items()})  # fmt: skip
        return executor

    @override
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        # One command at a time runs a sweep (on this machine: the jobs on the cluster are not held).
        with hold_sweep(sweep_dir):
            setup_globals()
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
            os.environ[SWEEP_DIR_ENV] = str(sweep_dir)  # the jobs inherit it: their resume hints name the sweep
            runs, planned = plan_jobs(job_overrides, initial_job_idx, self.job_config, self.rerun_failed)
            if planned:
                runs |= self.submit(planned)
        return [runs[index] for index in sorted(runs)]

    def submit(self, planned: Sequence[PlannedJob]) -> dict[int, JobReturn]:
        """Submit ``planned`` as one job array (one job each, with its own number) and wait for them.

        Returns:
            Each job's ``JobReturn`` by job number (its ``metrics.json``'s objective). A job that
            ended without a result (stopped and not requeued, cancelled, out of time) is recorded as
            ``stopped`` and a job whose task raised as ``failed`` in its ``metrics.json`` where it
            wrote none: the summary lists them, and continuing the sweep resumes or reruns them.
        """
        executor = self.executor()
        state = Singleton.get_state()
        arguments = [(job.overrides, "hydra.sweep.dir", job.index, f"job_id_for_{job.index}", state) for job in planned]
        jobs = executor.map_array(self, *zip(*arguments))
        for job, submitted in zip(planned, jobs):
            log.info(f"\t#{job.index} : submitit job {submitted.job_id} ({job.job_dir})")
        returns = {}
        for job, submitted in zip(planned, jobs):
            try:
                result = submitted.results()[0]  # global rank 0's
            except Exception as ended:  # submitit's UncompletedJobError: no result
                error, status = (str(ended).strip().splitlines() or [type(ended).__name__])[0], "stopped"
            else:
                error, status = None, "failed"
                if result.status is not JobStatus.COMPLETED:
                    try:
                        result.return_value  # noqa: B018 (Hydra's JobReturn raises the job's exception)
                    except Exception as raised:
                        error = f"{type(raised).__name__}: {raised}"
            if error is not None:
                log.warning(f"\t#{job.index} (submitit job {submitted.job_id}) ended without completing: {error}")
                if not read_metrics(job.job_dir):
                    job.job_dir.mkdir(parents=True, exist_ok=True)
                    write_json(job.job_dir / METRICS_FILE, {"status": status, "error": error,
                                                            "overrides": job.overrides})  # fmt: skip
            returns[job.index] = job_return(job)
        return returns

    @override
    def __call__(
        self,
        sweep_overrides: list[str],
        job_dir_key: str,
        job_num: int,
        job_id: str,
        singleton_state: dict[type, Singleton],
    ) -> JobReturn:
        # In each task of the job (python -m submitit.core._submit): every task runs the job's
        # function, and global rank 0 alone writes its .hydra/ config (as run_entry_point has it).
        self.prepare_task()
        if launcher_rank() > 0:
            sweep_overrides = [*sweep_overrides, "hydra.output_subdir=null"]
        return super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)

    def prepare_task(self) -> None:
        """Set up this task's process before it runs its job (on SLURM: nothing, ``srun`` did)."""


class SlurmSweepLauncher(SubmititSweep, SlurmLauncher):
    """``hydra/launcher=slurm``: each job of the sweep one SLURM job (see the module's docstring)."""

    def sbatch_script(self, job_count: int) -> str | None:
        """The batch script that :meth:`launch` would submit for a sweep of ``job_count`` jobs
        (submitit's ``sbatch`` text; ``sbatch`` itself is not run); None, said once, where the
        installed submitit cannot show it (:func:`~ddp_engine.core.compat.submitit_sbatch_script`).
        Needs ``srun`` on PATH (submitit refuses to build its SLURM executor elsewhere)."""
        return submitit_sbatch_script(self.executor(), job_count)


def slurm_variables_of_local_task(environ: os._Environ | dict = os.environ) -> dict[str, str]:
    """The variables that ``srun`` gives a task, for a task of submitit's local executor, from the
    ``SUBMITIT_LOCAL_*`` ones it sets instead (job id: its controller's pid; one node).

    The adapter of ``hydra/launcher=slurm_local``: with them the job's processes run the template's
    SLURM path on this machine as they do under SLURM (Lightning's SLURMEnvironment reads them), so
    that a SLURM sweep can be tried, and is tested, without a cluster. Not used on SLURM itself.
    """
    tasks = environ["SUBMITIT_LOCAL_NTASKS"]
    return {
        "SLURM_JOB_ID": environ["SUBMITIT_LOCAL_JOB_ID"],
        # Lightning's SLURMEnvironment ignores jobs named bash or interactive.
        "SLURM_JOB_NAME": "submitit-local",
        "SLURM_NTASKS": tasks,
        "SLURM_NTASKS_PER_NODE": tasks,
        "SLURM_JOB_NUM_NODES": environ["SUBMITIT_LOCAL_JOB_NUM_NODES"],
        "SLURM_NNODES": environ["SUBMITIT_LOCAL_JOB_NUM_NODES"],
        "SLURM_NODEID": environ["SUBMITIT_LOCAL_NODEID"],
        "SLURM_PROCID": environ["SUBMITIT_LOCAL_GLOBALID"],
        "SLURM_LOCALID": environ["SUBMITIT_LOCAL_LOCALID"],
        "SLURM_STEP_ID": "0",
        "SLURM_NODELIST": "127.0.0.1",
        "SLURM_JOB_NODELIST": "127.0.0.1",
    }


#: The pid of a ``slurm_local`` sweep's command, in its tasks' environment
#: (:func:`~ddp_engine.core.lifetime.stop_with_process`).
SUBMITTER_PID_ENV = "DDP_ENGINE_SWEEP_COMMAND_PID"


class LocalSlurmSweepLauncher(SubmititSweep, LocalLauncher):
    """``hydra/launcher=slurm_local``: the SLURM sweep on this machine, by submitit's local executor
    (each job one local submitit job of ``tasks_per_node`` tasks; no requeue: SLURM is not there)."""

    cluster = "local"

    @override
    def prepare_task(self) -> None:
        if os.environ.get(SUBMITIT_EXECUTOR_ENV) == "local":
            os.environ.update(slurm_variables_of_local_task())
            # Its parent is submitit's controller, not the sweep's command: it stops when that command ends.
            stop_with_process(int(os.environ[SUBMITTER_PID_ENV]), "sweep's command")

    @override
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        os.environ[SUBMITTER_PID_ENV] = str(os.getpid())  # the local tasks inherit it
        return super().launch(job_overrides, initial_job_idx)
