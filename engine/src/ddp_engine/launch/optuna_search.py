"""Hyperparameter search with Optuna (Hydra's Optuna sweeper) that the same command continues.

The study lives in the sweep's directory (``hydra.sweeper.storage``, by default
``sqlite:///<sweep dir>/optuna.db``: conf/hparams_search/optuna.yaml), so a search that was stopped
or killed keeps every trial it told. The same command again with ``hydra.sweep.dir=<that sweep>``
(checked first: :func:`ddp_engine.config.checks.check_sweep_dir`) loads the study and:

- runs each trial that was in flight (Optuna's state RUNNING: asked, never told) again with its own
  parameters and job number; the sweep's launcher resumes its job from its ``last.ckpt``, keeps it
  when it had completed, or starts it again (:mod:`ddp_engine.launch.sweep_launcher`); it is told
  complete with its job's objective, or failed;
- then asks new trials until the study holds ``hydra.sweeper.n_trials`` in all, numbered after the
  study's trials (trial ``n`` is job ``n``, in ``<sweep dir>/<n>``).

A continued search samples its new trials from the whole study's history, as an uninterrupted one
does, but from a sampler seeded anew: its new trials are not those the uninterrupted search would
have drawn.
"""

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf
from typing_extensions import override

from ddp_engine.core.compat import optuna_search
from ddp_engine.core.errors import ConfigValueError
from ddp_engine.core.files import write_atomically
from ddp_engine.core.objective import Mode
from ddp_engine.launch.sweep_launcher import hold_sweep

log = logging.getLogger(__name__)

#: The record of the sweep's command in its directory, as Hydra's basic sweeper writes it.
SWEEP_RECORD = "multirun.yaml"


class ResumableOptunaSweeper(Sweeper):
    """Hydra's Optuna sweeper (``hydra-optuna-sweeper``), continued when its study holds trials (see
    the module's docstring). Takes the plugin's settings (``hydra.sweeper.*``: direction, storage,
    study_name, n_trials, n_jobs, sampler, params, ...), with ``n_trials`` the study's total and
    ``direction`` null for the task's (``task.mode``: ``max`` is ``maximize``), whose objective
    (``task.objective``) each trial returns.

    Wraps the plugin's sweeper rather than subclassing it: Hydra imports every module of
    ``hydra_plugins`` whenever it looks for a plugin, and the plugin, an optional dependency
    (``pip install 'ddp-engine[optuna]'``), is imported only here, when a search runs.
    """

    def __init__(self, **settings: Any) -> None:
        # Optuna 2 (the plugin pins optuna<3) defines its storage with the SQLAlchemy 1.x API, which
        # SQLAlchemy 1.4 (pyproject.toml says why not 2) warns about on every search.
        os.environ.setdefault("SQLALCHEMY_SILENCE_UBER_WARNING", "1")
        self.settings = settings

    @override
    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper

        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        if self.settings.get("direction") is None:  # the task's: the direction of the objective each trial returns
            self.settings["direction"] = Mode(config.task.mode).optuna_direction
        self.optuna = OptunaSweeper(**self.settings)
        self.optuna.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    @override
    def sweep(self, arguments: list[str]) -> Any:
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        # One command at a time, across its trials' launches: a second one would ask trials of the same study.
        with hold_sweep(sweep_dir):
            return self._sweep(sweep_dir, arguments)

    def _sweep(self, sweep_dir: Path, arguments: list[str]) -> Any:
        """Run the search, continued when its study holds trials.

        Raises:
            ConfigValueError: for a study that holds trials, when the installed plugin cannot number
                the jobs of its new trials after them (:func:`~ddp_engine.core.compat.optuna_search`).
        """
        storage = self.settings.get("storage")  # the plugin's settings, which it builds its study from
        search = optuna_search(self.optuna)
        study = saved_study(storage, self.settings.get("study_name"))
        if study is not None and search is None:  # its jobs would be numbered from 0: those of the study's trials
            raise ConfigValueError(
                f"{sweep_dir} holds a search of {len(study.trials)} trials (study {study.study_name} in {storage}) "
                "that the installed hydra-optuna-sweeper cannot continue: it would number the new trials' jobs from 0, "
                "those of the study's trials. Start a new search in a new folder (hydra.sweep.dir=<new folder>), or "
                "continue this one with hydra-optuna-sweeper 1.3.0."
            )
        # Where the study's SQLite file goes, and the command's record that a continued search is checked against.
        # Atomically: a command killed as it starts leaves the record whole or absent, never half-written.
        write_atomically(sweep_dir / SWEEP_RECORD, OmegaConf.to_yaml(self.config))
        if study is not None:
            finish_trials_in_flight(study, self.new_launcher, list(self.config.hydra.sweeper.params or {}))
            done, asked = len(study.trials), self.settings["n_trials"]
            search.job_idx, search.n_trials = done, max(0, asked - done)
            # A seeded sampler would start drawing again where it started: the first new trials would
            # repeat the first trials' parameters (TPE's first ones are its seeded random draws).
            sampler = self.settings.get("sampler")  # the sampler built, the plugin's own
            if hasattr(sampler, "reseed_rng"):  # not the grid sampler, a class until the search builds it
                sampler.reseed_rng()
            beyond = f": the study already holds more than hydra.sweeper.n_trials={asked}" if asked < done else ""
            log.info(
                f"Continuing the search of {storage}: {done} trials done, {search.n_trials} to go "
                f"(hydra.sweeper.n_trials={asked} in all{beyond})"
            )
        return self.optuna.sweep(arguments)

    def new_launcher(self) -> Launcher:
        """A launcher of the sweep's jobs (``hydra.launcher``), built as the plugin's ``setup`` builds its own."""
        from hydra.core.plugins import Plugins

        return Plugins.instance().instantiate_launcher(
            config=self.config, hydra_context=self.hydra_context, task_function=self.task_function
        )


def saved_study(storage: str | None, study_name: str | None) -> Any:
    """The Optuna study named ``study_name`` in ``storage`` (an Optuna storage URL; None: in memory),
    or None when there is none yet."""
    import optuna

    if storage is None:
        return None
    try:
        return optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:  # Optuna's "Record does not exist": a new search
        return None


def finish_trials_in_flight(study: Any, new_launcher: Callable[[], Launcher], search_space: list[str]) -> None:
    """Run each trial of ``study`` left RUNNING (its command stopped or was killed before it told
    the result) again as job ``<trial number>`` with the trial's own parameters, through the sweep's
    launcher (built by ``new_launcher`` when there is one), and tell the study its result: complete
    with the job's objective, or failed. ``search_space``: the searched keys (``hydra.sweeper.params``),
    in the order of the overrides the search gave the trial's job (the study keeps them sorted by name)."""
    from optuna.trial import TrialState

    in_flight = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    launcher = new_launcher() if in_flight else None
    for trial in in_flight:
        # The plugin's overrides: the sampled parameters, then the fixed ones (kept as user attributes).
        params = sorted(
            trial.params.items(),
            key=lambda item: search_space.index(item[0]) if item[0] in search_space else len(search_space),
        )
        overrides = [f"{name}={value}" for name, value in [*params, *trial.user_attrs.items()]]
        log.info(f"Trial {trial.number} was in flight when the search stopped: it runs again with its parameters")
        [result] = launcher.launch([overrides], initial_job_idx=trial.number)
        value = objective(result)
        if value is None:
            study.tell(trial.number, state=TrialState.FAIL)
            log.warning(f"Failed experiment: trial {trial.number} returned no objective")
        else:
            study.tell(trial.number, value)


def objective(result: JobReturn) -> Any:
    """The objective a job returned (``task.objective`` of a training), or None for a job that failed."""
    return result.return_value if result.status is JobStatus.COMPLETED else None
