"""Where a private API that the launch and the config check use (``ddp_engine.core.compat``) is
missing or changed, as a library release may leave it, the command still does its work, and the
log says once what it lost: each test removes or changes one, as the library would, then runs the
code that uses it (twice: the line comes once) and checks what it did instead.

Each runs in this process; those that start a forkserver (its processes end with the test) are
marked ``processes``.
"""

import atexit
import logging
import multiprocessing
import os
import signal
import sys
from multiprocessing import forkserver, resource_tracker
from pathlib import Path

import pytest
from hydra.utils import instantiate

from ddp_engine.config.compose import composed_jobs
from ddp_engine.core import compat
from ddp_engine.core.errors import ConfigValueError, UsageError
from ddp_engine.core.lifetime import SUPERVISOR_ENV, exit_without_teardown


@pytest.fixture
def lost(monkeypatch, caplog):
    """The private APIs that compat says are lost, in the order said (each line as often as said)."""
    monkeypatch.setattr(compat, "_LOST", set())
    monkeypatch.setattr(logging.getLogger(compat.__name__), "disabled", False)  # other tests' logging configs
    caplog.set_level(logging.WARNING, logger=compat.__name__)

    def said() -> list[str]:
        messages = [record.getMessage() for record in caplog.records if record.name == compat.__name__]
        return [message.split(" is missing or changed")[0] for message in messages]

    return said


# --- Python: the exit handlers, the forkserver, the resource tracker -------------------------------


def test_without_atexits_run_exitfuncs_a_command_ends_through_the_normal_exit_which_runs_them(monkeypatch, lost):
    monkeypatch.delattr(atexit, "_run_exitfuncs")
    ended_without_teardown = []
    monkeypatch.setattr(os, "_exit", ended_without_teardown.append)  # recorded instead of ending pytest
    ran = []
    handler = lambda: ran.append("handler")  # noqa: E731
    atexit.register(handler)
    try:
        for command, status in ((lambda: None, 0), (lambda: sys.exit(3), 3)):
            with pytest.raises(SystemExit) as ended:
                exit_without_teardown(command)
            assert ended.value.code == status
    finally:
        atexit.unregister(handler)
    # Not os._exit, which would skip the handlers: the normal exit, which runs them (here: pytest's end).
    assert ended_without_teardown == [] and ran == []
    assert lost() == ["atexit._run_exitfuncs"]


def test_without_atexits_run_exitfuncs_a_worker_completes_its_job(monkeypatch, lost):
    # ddp_engine.launch.worker.run, as torch's agent runs it in a rank forked from the forkserver,
    # less what would change this process: its signals, its parent's watch, its title.
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from ddp_engine.launch import forkserver_preload, worker

    monkeypatch.delattr(atexit, "_run_exitfuncs")
    monkeypatch.setattr(forkserver_preload, "FORKSERVER_PID", -1)  # forked from the forkserver
    for name in ("end_quietly_on_stop_signals", "end_with_parent", "drop_output_when_closed"):
        monkeypatch.setattr(worker, name, lambda *args: None)
    monkeypatch.setattr("setproctitle.setproctitle", lambda title: None)
    monkeypatch.setattr(rank_zero_only, "rank", rank_zero_only.rank)  # restored after
    monkeypatch.setenv("RANK", "0")
    ran = []
    monkeypatch.setattr(worker, "main", ran.append)
    start_method = multiprocessing.get_start_method(allow_none=True)
    try:
        worker.run("job.yaml", dict(os.environ))
        worker.run("job.yaml", dict(os.environ))
    finally:
        multiprocessing.set_start_method(start_method, force=True)
    assert ran == ["job.yaml", "job.yaml"]
    assert lost() == ["atexit._run_exitfuncs"]


@pytest.fixture
def own_forkserver(monkeypatch):
    """A forkserver of this test's own behind ``multiprocessing.forkserver``'s functions (pytest's
    process keeps one forkserver for its life, which another test may have started, with other
    modules), stopped after the test."""
    server = forkserver.ForkServer()
    for name in ("ensure_running", "get_inherited_fds", "connect_to_new_process", "set_forkserver_preload"):
        monkeypatch.setattr(forkserver, name, getattr(server, name))
    yield server
    server._stop()


def child_of_this_process(pid: int | None) -> bool:
    status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(status["PPid"]) == os.getpid() and status["State"][0] != "Z"


def sighup_blocked() -> bool:
    return signal.SIGHUP in signal.pthread_sigmask(signal.SIG_BLOCK, [])


@pytest.mark.processes
def test_without_forkservers_ensure_running_the_supervisor_starts_its_forkserver_with_a_process(
    monkeypatch, own_forkserver, lost
):
    from ddp_engine.launch.supervisor import preload_workers

    monkeypatch.delattr(forkserver, "ensure_running")
    monkeypatch.setenv(SUPERVISOR_ENV, "")  # restored after: preload_workers sets it
    preload_workers("json")
    pid = own_forkserver._forkserver_pid
    preload_workers("json")  # running: the same one (a process that does nothing, 5 to 25 ms)
    # Started by this thread, as ensure_running would (it ends with its thread), and running.
    assert pid is not None and own_forkserver._forkserver_pid == pid and child_of_this_process(pid)
    assert not sighup_blocked()
    assert lost() == ["multiprocessing.forkserver.ensure_running"]


@pytest.mark.processes
def test_without_forkservers_ensure_running_a_loaders_workers_start_from_the_forkserver(
    monkeypatch, own_forkserver, lost
):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from ddp_engine.data.loader_workers import LOADER_FORKSERVER_PARENT_ENV, workers_context

    monkeypatch.delattr(forkserver, "ensure_running")
    monkeypatch.delenv(LOADER_FORKSERVER_PARENT_ENV, raising=False)  # restored after: set by the first call
    context = workers_context("torch.utils.data")
    pid = own_forkserver._forkserver_pid
    assert workers_context("torch.utils.data") is context and own_forkserver._forkserver_pid == pid
    assert child_of_this_process(pid)  # started by this thread, before any worker
    loader = DataLoader(TensorDataset(torch.arange(4.0)), batch_size=2, num_workers=1, multiprocessing_context=context)
    assert [batch.tolist() for (batch,) in loader] == [[0.0, 1.0], [2.0, 3.0]]
    assert lost() == ["multiprocessing.forkserver.ensure_running"]


def test_without_the_resource_trackers_ensure_running_nothing_starts_with_sighup_blocked(
    monkeypatch, own_forkserver, lost
):
    from ddp_engine.launch.supervisor import preload_workers

    monkeypatch.delattr(resource_tracker, "ensure_running")
    monkeypatch.setenv(SUPERVISOR_ENV, "")
    started = []  # whether SIGHUP was blocked as the forkserver (which the ranks are forked from) started
    monkeypatch.setattr(compat, "start_forkserver", lambda context: started.append(sighup_blocked()))
    preload_workers("json")
    preload_workers("json")
    assert started == [False, False] and not sighup_blocked()
    assert lost() == ["multiprocessing.resource_tracker.ensure_running"]


def test_the_resource_tracker_starts_with_sighup_blocked_and_the_mask_is_restored(monkeypatch, lost):
    started = []
    monkeypatch.setattr(resource_tracker, "ensure_running", lambda: started.append(sighup_blocked()))
    compat.start_resource_tracker_with_sighup_blocked()
    assert started == [True] and not sighup_blocked() and lost() == []


# --- torch: the rendezvous' event names ------------------------------------------------------------


def test_without_torchs_get_method_name_nothing_is_installed(monkeypatch, lost):
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    monkeypatch.delattr(dynamic_rendezvous, "get_method_name")
    assert not compat.name_rendezvous_events_by_frame() and not compat.name_rendezvous_events_by_frame()
    assert not hasattr(dynamic_rendezvous, "get_method_name")  # no name that torch would not call
    assert lost() == ["torch.distributed.elastic.rendezvous.dynamic_rendezvous.get_method_name"]


def test_a_get_method_name_with_other_parameters_is_left_as_torch_has_it(monkeypatch, lost):
    from torch.distributed.elastic.rendezvous import RendezvousParameters, dynamic_rendezvous
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    names = []
    torchs = dynamic_rendezvous.get_method_name

    def get_method_name(depth: int = 2, frames: int = 0) -> str:  # as a torch release may change it
        names.append(torchs(depth + 1 + frames))
        return names[-1]

    monkeypatch.setattr(dynamic_rendezvous, "get_method_name", get_method_name)
    assert not compat.name_rendezvous_events_by_frame() and not compat.name_rendezvous_events_by_frame()
    assert dynamic_rendezvous.get_method_name is get_method_name
    assert lost() == ["torch.distributed.elastic.rendezvous.dynamic_rendezvous.get_method_name"]
    # The supervisor's rendezvous runs with torch's own.
    parameters = RendezvousParameters("c10d", "localhost:0", run_id="compat", min_nodes=1, max_nodes=1, timeout=30)
    handler = get_rendezvous_handler(parameters)
    info = handler.next_rendezvous()
    handler.shutdown()
    assert (info.rank, info.world_size) == (0, 1) and "next_rendezvous" in names


# --- Hydra: the mode its main reads ----------------------------------------------------------------


def test_without_hydras_get_mode_nothing_is_installed(monkeypatch, lost):
    from hydra._internal.hydra import Hydra
    from hydra.types import RunMode

    monkeypatch.delattr(Hydra, "get_mode")
    assert not compat.tell_hydra_the_mode(RunMode.RUN) and not compat.tell_hydra_the_mode(None)
    assert not hasattr(Hydra, "get_mode")
    assert lost() == ["hydra._internal.hydra.Hydra.get_mode"]


def test_a_get_mode_with_other_parameters_is_left_as_hydra_has_it_and_hydras_main_runs(monkeypatch, tmp_path, lost):
    import hydra
    from hydra._internal.hydra import Hydra
    from hydra.types import RunMode

    hydras = Hydra.get_mode

    def get_mode(self, config_name, overrides, *, run_mode=RunMode.MULTIRUN):  # as a Hydra release may change it
        return hydras(self, config_name, overrides)

    monkeypatch.setattr(Hydra, "get_mode", get_mode)
    assert not compat.tell_hydra_the_mode(RunMode.RUN) and not compat.tell_hydra_the_mode(RunMode.RUN)
    assert Hydra.get_mode is get_mode
    assert lost() == ["hydra._internal.hydra.Hydra.get_mode"]
    (tmp_path / "app.yaml").write_text("value: 1\n")
    ran, composed = [], []
    compose = Hydra.compose_config
    monkeypatch.setattr(Hydra, "compose_config", lambda self, *a, **k: composed.append(1) or compose(self, *a, **k))

    @hydra.main(config_path=str(tmp_path), config_name="app", version_base="1.3")
    def app(cfg) -> None:
        ran.append(cfg.value)

    quiet = ["hydra/job_logging=disabled", "hydra/hydra_logging=disabled", "hydra.output_subdir=null"]
    monkeypatch.setattr(sys, "argv", ["app", f"hydra.run.dir={tmp_path}/run", *quiet, "value=2"])
    app()
    assert ran == [2] and len(composed) == 2  # the mode read by composing, as Hydra does by itself


# --- hydra-optuna-sweeper: a search's job numbers ---------------------------------------------------


class RenamedSearch:
    """hydra-optuna-sweeper's ``OptunaSweeper`` as a release may have it: its search kept under
    another name than ``sweeper``, the sweeper working as before."""

    #: The plugin's own class.
    plugin: type

    def __init__(self, **settings) -> None:
        self.search = self.plugin(**settings).sweeper

    def setup(self, **arguments) -> None:
        self.search.setup(**arguments)

    def sweep(self, arguments: list[str]) -> None:
        return self.search.sweep(arguments)


#: A search config as a project writes one (``-m +hparams_search=search``): the engine's continued Optuna
#: sweeper, its study in the sweep's directory, one trial at a time.
SEARCH = """\
# @package _global_
defaults:
  - override /hydra/sweeper: optuna
hydra:
  sweeper:
    _target_: hydra_plugins.ddp_engine_sweeper.ResumableOptunaSweeper
    direction: null
    study_name: sensors
    storage: sqlite:///${hydra.sweep.dir}/optuna.db
    n_trials: 20
    n_jobs: 1
    max_failure_rate: 1.0
    sampler:
      seed: ${seed}
    params:
      model.optimizer.lr: tag(log, interval(0.0005, 0.01))
"""


@pytest.fixture
def search(tmp_path, windows) -> list[str]:
    """The overrides of the search: :data:`SEARCH` on Hydra's search path, over the test task's windows."""
    configs = tmp_path / "configs"
    (configs / "hparams_search").mkdir(parents=True)
    (configs / "hparams_search" / "search.yaml").write_text(SEARCH)
    return [f"hydra.searchpath=[file://{configs}]", "+hparams_search=search", f"data.path={windows}"]


def optuna_search_command(monkeypatch, search: list[str], sweep_dir: Path, n_trials: int) -> tuple:
    """The search of ``-m <search>`` into ``sweep_dir``, set up as Hydra sets it up, and the jobs
    it launches: ``(first job number, jobs)`` of each launch, which a stand-in for the sweep's
    launcher records (each job returns 0.5)."""
    from hydra.core.plugins import Plugins
    from hydra.core.utils import JobReturn, JobStatus

    launched = []

    class Launcher:
        def launch(self, overrides, initial_job_idx):
            launched.append((initial_job_idx, len(overrides)))
            returns = [JobReturn(overrides=list(job), status=JobStatus.COMPLETED) for job in overrides]
            for returned in returns:
                returned.return_value = 0.5
            return returns

    monkeypatch.setattr(Plugins, "instantiate_launcher", lambda self, **arguments: Launcher())
    args = ["-m", *search, f"hydra.sweep.dir={sweep_dir}", f"hydra.sweeper.n_trials={n_trials}"]
    (job,) = composed_jobs("config", args)
    sweeper = instantiate(job.cfg.hydra.sweeper)
    sweeper.setup(hydra_context=object(), task_function=None, config=job.cfg)  # the context only passes through
    return sweeper, launched


def test_without_the_plugins_search_a_new_search_runs_and_a_continued_one_is_refused(
    monkeypatch, tmp_path, search, lost
):
    from hydra_plugins.hydra_optuna_sweeper import optuna_sweeper

    monkeypatch.setattr(RenamedSearch, "plugin", optuna_sweeper.OptunaSweeper, raising=False)
    monkeypatch.setattr(optuna_sweeper, "OptunaSweeper", RenamedSearch)
    sweep_dir = tmp_path / "search"
    sweeper, launched = optuna_search_command(monkeypatch, search, sweep_dir, n_trials=2)
    sweeper.sweep([])
    assert launched == [(0, 1), (1, 1)]  # as the plugin runs it
    record = (sweep_dir / "multirun.yaml").read_bytes()
    sweeper, launched = optuna_search_command(monkeypatch, search, sweep_dir, n_trials=3)
    with pytest.raises(ConfigValueError, match=r"holds a search of 2 trials .* cannot continue: .*hydra\.sweep\.dir="):
        sweeper.sweep([])
    assert launched == [] and (sweep_dir / "multirun.yaml").read_bytes() == record  # nothing run, nothing written
    assert lost() == ["hydra-optuna-sweeper's OptunaSweeper.sweeper"]


def test_with_the_plugins_search_a_continued_search_numbers_its_jobs_after_the_studys(
    monkeypatch, tmp_path, search, lost
):
    sweep_dir = tmp_path / "search"
    sweeper, launched = optuna_search_command(monkeypatch, search, sweep_dir, n_trials=2)
    sweeper.sweep([])
    sweeper, launched = optuna_search_command(monkeypatch, search, sweep_dir, n_trials=3)
    sweeper.sweep([])
    assert launched == [(2, 1)] and lost() == []


# --- submitit: the batch script of a SLURM sweep ----------------------------------------------------


def hidden_from_compat(name: str) -> property:
    """An attribute of a library's objects that reads and writes as before, except from
    ``ddp_engine.core.compat``, where it is gone: as the library would have it renamed (its own
    code, which reads it too, working as before)."""

    def read(self):
        if sys._getframe(1).f_globals.get("__name__") == compat.__name__:
            raise AttributeError(name)
        return self.__dict__[name]

    def write(self, value) -> None:
        self.__dict__[name] = value

    return property(read, write)


def test_without_submitits_executor_internals_the_batch_script_is_not_shown(monkeypatch, tmp_path, sensor_data, lost):
    import submitit

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 1\n")  # never run: submitit only looks for it on PATH
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    args = ["-m", *sensor_data, "hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path / 'sweep'}",
            "trainer.accelerator=cpu", "trainer.devices=2", "seed=1,2"]  # fmt: skip
    (job, _) = composed_jobs("config", args)
    launcher = instantiate(job.cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=None, config=job.cfg)
    assert launcher.sbatch_script(job_count=2).startswith("#!/bin/bash")
    monkeypatch.setattr(submitit.AutoExecutor, "_executor", hidden_from_compat("_executor"), raising=False)
    assert launcher.sbatch_script(job_count=2) is None and launcher.sbatch_script(job_count=2) is None
    assert lost() == ["submitit's _make_sbatch_string, AutoExecutor._executor or SlurmExecutor._submitit_command_str"]


# --- OmegaConf: a null node's declared type -------------------------------------------------------


def test_without_omegaconfs_ref_type_an_unknown_key_under_a_null_node_is_still_refused(monkeypatch, sensor_data, lost):
    from omegaconf.base import Metadata

    # The check that describes the unknown key falls back to the config without the command's
    # choices (their seed does not compose either), where logger.mlflow is null: its schema's
    # declared type names its keys.
    args = [*sensor_data, "logger=mlflow", "logger.mlflow.trackinguri=x", "seed=abc"]
    with pytest.raises(UsageError, match=r"Unknown key logger\.mlflow\.trackinguri .*Did you mean logger\.mlflow\.tr"):
        composed_jobs("config", args)
    monkeypatch.setattr(Metadata, "ref_type", hidden_from_compat("ref_type"), raising=False)
    for _ in range(2):  # refused, its keys not listed
        with pytest.raises(
            UsageError, match=r"^Unknown key logger\.mlflow\.trackinguri \(keys of logger\.mlflow: not k"
        ):
            composed_jobs("config", args)
    assert lost() == ["OmegaConf's Node._metadata.ref_type"]
