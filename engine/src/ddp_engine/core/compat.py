"""The private APIs of Lightning, torch, Python, OmegaConf, Hydra and its plugins that the engine
relies on: the one module that touches them. Each is read through :func:`_private` (ruff's SLF001
refuses ``owner._name`` everywhere else, and here too), and each degrades: where a release has
removed or changed it, the run goes on and says once, per process, what it lost (:func:`_lost`).
``engine/tests/core/test_compat.py`` checks that each still behaves as relied on and that no other module
uses a private attribute of a library or imports or names (a class path in a string) a private
module of one; the fallback tests hide each name from :func:`_private` and run the path that uses
it (``engine/tests/core/test_compat_fallbacks.py``, ``engine/tests/core/test_compat_fallbacks_launch.py``),
and a default training runs with all of them hidden (``engine/tests/core/test_training_without_private_apis.py``).

Known to work with torch 2.14.1, lightning 2.6.6, omegaconf 2.3.1, tensorboard 2.21.0,
hydra-optuna-sweeper 1.3.0 and submitit 1.5.4 (``constraints.txt``). Each private API, the
public one missing, and what a run does without it:

Lightning
    - ``_TrainingEpochLoop._broadcast_sigterm_tensor`` (replaced on the instance,
      :func:`skip_sigterm_broadcast`): no setting turns off the per-step broadcast of the SIGTERM
      flag (a tenth of a small model's step on gloo). Without it: the loop keeps its broadcast.
    - ``trainer.fit_loop.epoch_loop.batch_progress.current.processed`` and ``.ready``
      (:func:`epoch_batches_processed`, :func:`epoch_batches_ready`): the count of the epoch's
      batches that the training loader saves as its position (a hook's ``batch_idx`` exists only
      inside the hook; a checkpoint is written outside). Without it: the count is worked out from
      the Trainer's public step counters, the same at every optimizer-step boundary while every
      epoch has as many batches.
    - ``trainer._logger_connector.should_update_logs`` (:func:`logs_this_step`): whether the values a
      training step logs ``on_step`` reach the loggers; the Trainer has no public accessor. Without
      it: the step computes what it logs at every step.
    - ``ModelCheckpoint._every_n_epochs`` (written, :func:`also_save_at_epoch_end`): the constructor
      takes one trigger, and the ``every_n_epochs`` property has no setter. Without it:
      ``LastCheckpoint`` saves at each training epoch's end itself.
    - ``ModelCheckpoint._save_topk_checkpoint`` and ``_monitor_candidates`` (:func:`save_checkpoint_now`):
      no public method saves a callback's checkpoint outside its own triggers. Without them:
      ``Trainer.save_checkpoint`` into the callback's file name, without its bookkeeping.
    - The checkpoint's ``loops`` -> ``fit_loop`` -> ``state_dict`` -> ``combined_loader``
      (:func:`saved_loader_states`): where Lightning saves the training loaders' state; its
      checkpoint format documents the top-level keys only. Without it: a resume says the checkpoint
      holds no position inside an epoch (Lightning restores the loaders itself).

torch
    - ``DistributedDataParallel._get_ddp_logging_data()`` (:func:`ddp_logging_data`): the gradient
      buckets, the registered communication hook and DDP's own timing of its iterations have no
      public accessor; ``_set_ddp_runtime_logging_sample_rate`` (:func:`sample_ddp_runtime_every`):
      how often DDP times an iteration has no public setting. Without them: ``ddp.json`` has null
      for the hook and the bucket sizes (the buckets' bytes are counted from the parameters), the
      step anatomy has no DDP timings.
    - ``Backend.Options._timeout`` (:func:`process_group_timeout`): a process group's timeout can be
      set (``init_process_group(timeout=)``, ``set_timeout``) but not read. The backend comes from
      ``torch.distributed.get_backend_impl`` (public in torch 2.14), on older versions from
      ``ProcessGroup._get_backend``. Without it: ``ddp.json``'s ``timeout_s`` is null.
    - ``torch.utils.tensorboard.SummaryWriter._get_file_writer()`` (:func:`tensorboard_file_writer`):
      the writer's ``add_*`` methods build their own summaries, none takes a prebuilt one (TensorBoard's
      HPARAMS summaries); the public ``file_writer`` attribute is None once the writer is closed.
      Without it: that attribute, and nothing written once the writer is closed.
    - ``LRScheduler``'s tracking of ``optimizer.step`` (the ``_wrapped_by_lr_sched`` mark on the wrapped
      ``step`` and the optimizer's ``_opt_called`` flag, written; :func:`retarget_lr_scheduler`): a
      scheduler is bound to its optimizer when built, with no public way to move it onto another
      (the ZeRO-1 optimizer that replaces the configured one) without torch warning on its first
      step. Where torch reads other marks: that one warning, the schedule unchanged.
    - ``ZeroRedundancyOptimizer._all_state_dicts`` (:func:`release_consolidated_state`): the
      consolidated copy of every rank's state that ``consolidate_state_dict`` leaves on rank 0, with
      no public way to free it once the checkpoint holding it is written. Without it: the copy stays
      on rank 0 between checkpoints.
    - ``ZeroRedundancyOptimizer._partition_parameters()`` (:func:`zero_partition`): which rank
      keeps which parameters' state is torch's choice, and only this rank's share is public
      (``optim.param_groups``). Without it: a plan gives ZeRO-1's state for its own rank only.
    - ``torch.testing._internal.distributed.fake_pg`` (imported, :func:`init_fake_process_group`):
      torch's process group without peers is the public ``Backend.FAKE`` in torch 2.14; older
      releases register it, with its store, in that module. Without either: a plan runs no step as
      its rank.
    - ``torch.distributed.elastic.rendezvous.dynamic_rendezvous.get_method_name`` (replaced,
      :func:`name_rendezvous_events_by_frame`): the c10d rendezvous names each event it records by
      its caller through ``inspect.stack()``, which maps every frame of the stack to its module and
      scans ``sys.modules`` for each one it cannot map (``<frozen runpy>``, under ``python -m``);
      no setting turns the records off. Missing, or with other parameters: nothing is replaced, and
      the workers start 0.3 to 0.6 s later.

hydra-optuna-sweeper
    - ``OptunaSweeper.sweeper`` and its ``job_idx`` and ``n_trials`` (:func:`optuna_search`): the
      plugin has no setting to start a search at a job number other than 0, nor to ask fewer trials
      than ``n_trials`` (a continued search's). Without them: a new search runs as the plugin's; one
      over a saved study is refused (a new ``hydra.sweep.dir``).

submitit (``hydra/launcher=slurm``)
    - ``AutoExecutor._executor``, ``SlurmExecutor._submitit_command_str`` and
      ``submitit.slurm.slurm._make_sbatch_string`` (:func:`submitit_sbatch_script`): the batch script
      an executor submits is written only as it submits (``sbatch``, on a cluster). Without them:
      the script cannot be shown (``sbatch_script`` gives None); a sweep submits through ``map_array``.

Hydra
    - ``hydra._internal.hydra.Hydra.get_mode`` (replaced, :func:`tell_hydra_the_mode`): Hydra's
      main composes the whole config once to read ``hydra.mode``, then again to run it
      (Hydra issue #3440, open); no setting gives it the mode. Missing, or with other parameters:
      nothing is replaced, Hydra composes twice (0.25 to 0.3 s).
    - Not here: ``hydra.core.singleton.Singleton.get_state()``, which the SLURM launcher passes to
      its jobs, is Hydra's launcher-plugin protocol (Hydra's own launchers pass it, and the submitit
      plugin's ``__call__`` sets it), in a public module under a public name.

Python
    - ``atexit._run_exitfuncs()`` (:func:`run_exit_handlers`): a process that ``multiprocessing``
      started ends with ``os._exit``, so the ``atexit`` handlers a normal exit runs do not run (W&B's,
      which finishes its run and sends its last values); no public call runs them. Without it: a
      command's own process ends through the normal exit (about 1.3 s of teardown more); a worker's
      handlers do not run (W&B's run is not finished, its last values not sent).
    - ``multiprocessing.forkserver.ensure_running()`` (:func:`start_forkserver`): Python documents no
      call that starts the forkserver without starting a process. Without it: a process that does
      nothing is started and joined, and the command waits for the forkserver's imports instead of
      checking its values meanwhile (measured: a 2-process run's whole command 2.7 s longer).
    - ``multiprocessing.resource_tracker.ensure_running()`` (:func:`start_resource_tracker_with_sighup_blocked`):
      nothing public starts the tracker alone, so that it starts with SIGHUP blocked. Without it: the
      forkserver starts it with SIGHUP unblocked, and after a closed terminal each worker that ends
      may print the tracker's KeyError traceback.

OmegaConf
    - ``Node._metadata.ref_type`` (:func:`declared_type`): ``OmegaConf.get_type`` gives a value's
      type, which a node set to null does not have; the type its schema declares has no public API.
      Without it: an unknown key under a null node is still refused, its node's keys "not known".

Replaced by public APIs: ``DDPStrategy.configure_ddp``, overridden with the strategy's own copy of
``DistributedDataParallel``'s arguments, for ``DDPStrategy._setup_model``, ``_register_ddp_hooks``
and ``_ddp_kwargs``; the hooks' ``batch_idx`` for the optimizer-step boundary; the engine's
``UnpaddedDistributedSampler`` for ``lightning.pytorch.overrides.distributed.UnrepeatedDistributedSampler``;
``torch.serialization.get_unsafe_globals_in_checkpoint`` for the text of the weights-only
unpickler's error; ``OmegaConf.is_interpolation(node, key)`` for ``node._get_node(key)._is_interpolation()``,
``OmegaConf.to_container(node, resolve=False)`` for ``._value()``, ``node[key]`` for ``._get_node(key)``
and ``._is_none()`` of a node that is no interpolation, MLflow's ``MlflowClient.tracking_uri`` for
``MLFlowLogger._tracking_uri``, Hydra's ConfigStore entry ``hydra/sweeper/basic`` for the class
path ``hydra._internal.core_plugins.basic_sweeper.BasicSweeper``
(:func:`ddp_engine.config.checks.basic_sweeper`); the Optuna plugin's settings for its search's
``storage``, ``study_name`` and ``sampler``, and ``Plugins.instance().instantiate_launcher`` for its
``launcher``; ``CSVLogger`` and ``LastCheckpoint`` keep what they read of Lightning's ``_experiment``
and ``_train_time_interval`` themselves.

Lightning and torch are imported inside the functions: the command line is checked before, with Hydra alone.
"""

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multiprocessing.context import BaseContext

    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint
    from omegaconf import DictConfig
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.writer import FileWriter

log = logging.getLogger(__name__)
#: The private APIs found missing or changed in this process, each reported once (:func:`_lost`).
_LOST: set[str] = set()


def _private(owner: Any, name: str) -> Any:
    """``owner``'s private attribute ``name``: every private name of a library that this module
    reads or replaces goes through here (ruff's SLF001 refuses ``owner._name`` in the engine), so
    that a test can make any one missing, as a release that renames it would.

    Raises:
        AttributeError: when ``owner`` has no ``name``.
    """
    return getattr(owner, name)


def _replace(owner: Any, name: str, value: Any) -> None:
    """Set ``owner``'s private attribute ``name``, which must exist (:func:`_private`), to ``value``.

    Raises:
        AttributeError: when ``owner`` has no ``name``: setting it would change nothing the library reads.
    """
    _private(owner, name)
    setattr(owner, name, value)


def _private_or_none(owner: Any, name: str) -> Any:
    """:func:`_private`, None where ``owner`` has no ``name``."""
    try:
        return _private(owner, name)
    except AttributeError:
        return None


def _lost(private: str, loss: str) -> None:
    """Say once per process that ``private`` is missing or changed in the installed library, and
    what the run does without it (``loss``): the run goes on."""
    if private not in _LOST:
        _LOST.add(private)
        log.warning(f"{private} is missing or changed in the installed version: {loss}")


def _epoch_loop(trainer: "L.Trainer") -> Any:
    """Lightning's private training epoch loop (``_TrainingEpochLoop``) of ``trainer``'s fit loop."""
    return trainer.fit_loop.epoch_loop


def _epoch_progress(trainer: "L.Trainer") -> Any:
    """The epoch loop's count of the current epoch's batches (``batch_progress.current``: ``ready``, ``processed``).

    Raises:
        AttributeError: where Lightning no longer keeps it there.
    """
    return _private(_epoch_loop(trainer), "batch_progress").current


def epoch_batches_processed(trainer: "L.Trainer") -> int:
    """The batches of the current training epoch whose training step has run on this rank, those
    before a resume included (Lightning restores the count from the checkpoint); in
    ``on_train_batch_end``, the batch that just trained is counted.

    Lightning's ``trainer.fit_loop.epoch_loop.batch_progress.current.processed``. Where Lightning
    no longer has it (said once), the count is worked out from public counters
    (:func:`batches_from_optimizer_steps`): exact at optimizer-step boundaries, where checkpoints
    are saved, while every epoch so far had this epoch's number of batches.
    """
    try:
        return int(_epoch_progress(trainer).processed)
    except AttributeError:
        _lost(
            "Trainer.fit_loop.epoch_loop.batch_progress",
            "the position inside an epoch is counted from the optimizer steps (exact while every epoch "
            "has as many batches as this one: keep trainer.limit_train_batches across a resume).",
        )
        return batches_from_optimizer_steps(trainer)


def batches_from_optimizer_steps(trainer: "L.Trainer") -> int:
    """The batches of the current epoch up to its latest optimizer step, from the Trainer's public
    counters: ``global_step`` less the steps of the epochs before (each ``ceil(num_training_batches
    / accumulate_grad_batches)``: Lightning steps at an epoch's last batch), times
    ``accumulate_grad_batches``, at most ``num_training_batches``. Exact at an optimizer-step
    boundary when every epoch had ``num_training_batches`` batches."""
    batches, accumulate = int(trainer.num_training_batches), trainer.accumulate_grad_batches
    steps_per_epoch = -(-batches // accumulate)
    steps = trainer.global_step - trainer.current_epoch * steps_per_epoch
    return max(0, min(batches, steps * accumulate))


def epoch_batches_ready(trainer: "L.Trainer") -> int:
    """The batches of the current training epoch fetched before the one being prepared: that
    batch's index in the epoch, in ``on_after_batch_transfer`` (Lightning counts a batch once the
    hook has returned).

    Lightning's ``trainer.fit_loop.epoch_loop.batch_progress.current.ready``; where it is gone (said
    once), :func:`epoch_batches_processed`'s fallback, the same number at an optimizer-step boundary.
    """
    try:
        return int(_epoch_progress(trainer).ready)
    except AttributeError:
        return epoch_batches_processed(trainer)


def logs_this_step(trainer: "L.Trainer") -> bool:
    """Whether the values logged with ``on_step=True`` in this training step are written to the
    loggers: every ``trainer.log_every_n_steps`` optimizer steps (all micro-batches of that step),
    and at a stop; never with ``log_every_n_steps=0``.

    Lightning's ``trainer._logger_connector.should_update_logs``, the rule its logger connector
    applies; True at every step, said once, where Lightning no longer has it (the step computes what
    it logs every time, of which Lightning writes the same values as before).
    """
    try:
        return bool(_private(trainer, "_logger_connector").should_update_logs)
    except AttributeError:
        _lost(
            "Trainer._logger_connector.should_update_logs",
            "the training step's logged values are computed at every step.",
        )
        return True


def optuna_search(sweeper: Any) -> Any | None:
    """The search inside hydra-optuna-sweeper's ``OptunaSweeper`` (its ``OptunaSweeperImpl``, the
    ``sweeper`` attribute), whose ``job_idx`` (the number of the first job it launches; its
    constructor and ``setup`` set 0) and ``n_trials`` (how many trials it asks) a continued search
    (:mod:`ddp_engine.launch.optuna_search`) sets before ``sweep``: it numbers its jobs after the
    study's trials and asks only the trials still to go.

    None, said once, where the plugin no longer has them (or they are no numbers): a new search
    runs as the plugin runs it, and one that continues a study is refused (the plugin would
    number its jobs from 0, those of the study's trials).
    """
    try:
        search = _private(sweeper, "sweeper")
    except AttributeError:
        search = None
    missing = [name for name in ("job_idx", "n_trials") if not isinstance(_private_or_none(search, name), int)]
    if search is None or missing:
        _lost(
            f"hydra-optuna-sweeper's OptunaSweeper.sweeper{'' if search is None else '.' + missing[0]}",
            "a search cannot be continued: one that stops must start anew, in a new hydra.sweep.dir.",
        )
        return None
    return search


def _no_broadcast() -> None:
    """Stands in for the SIGTERM-flag broadcast (:func:`skip_sigterm_broadcast`)."""


def skip_sigterm_broadcast(trainer: "L.Trainer") -> bool:
    """Stop ``trainer``'s training loop from broadcasting global rank 0's "received SIGTERM" flag
    before every training step; returns whether the broadcast was found (and skipped).

    For a run whose own handlers take SIGTERM instead of Lightning's (which alone sets the flag):
    the broadcast then carries nothing and costs a collective per step. Replaces Lightning's
    ``_TrainingEpochLoop._broadcast_sigterm_tensor`` on the loop instance, which the loop calls
    through ``self`` at each step.
    """
    try:
        _replace(_epoch_loop(trainer), "_broadcast_sigterm_tensor", _no_broadcast)
    except AttributeError:
        _lost(
            "_TrainingEpochLoop._broadcast_sigterm_tensor",
            "if the training loop still broadcasts Lightning's SIGTERM flag, it does so at every step.",
        )
        return False
    return True


def also_save_at_epoch_end(checkpoint: "ModelCheckpoint") -> bool:
    """Have ``checkpoint``, built with a trigger inside epochs (``every_n_train_steps`` or
    ``train_time_interval``), also save at the end of every epoch; returns whether it does.

    ``ModelCheckpoint``'s constructor refuses two triggers and its ``every_n_epochs`` property has
    no setter: this sets Lightning's ``ModelCheckpoint._every_n_epochs``, which its epoch-end hooks
    read. Where the property no longer reads it back, False (said once): the caller saves at the
    epoch's end itself.
    """
    try:
        _replace(checkpoint, "_every_n_epochs", 1)
    except AttributeError:
        pass
    if getattr(checkpoint, "every_n_epochs", None) == 1:
        return True
    _lost(
        "ModelCheckpoint._every_n_epochs",
        "last.ckpt is saved at each epoch's end by the engine, at the end of training (before validation).",
    )
    return False


def save_checkpoint_now(checkpoint: "ModelCheckpoint", trainer: "L.Trainer") -> None:
    """Save ``checkpoint``'s file now, as its own triggers do: same file name and ``best_model_path``,
    the previous file replaced, loggers notified. Call it on every rank together.

    ``Trainer.save_checkpoint`` writes a file only, outside the callback's bookkeeping. Lightning's
    ``ModelCheckpoint._save_topk_checkpoint(trainer, ModelCheckpoint._monitor_candidates(trainer))``;
    where they are gone (said once), ``Trainer.save_checkpoint`` into the file the callback names
    (``format_checkpoint_name``), without its bookkeeping.
    """
    try:
        save, candidates = _private(checkpoint, "_save_topk_checkpoint"), _private(checkpoint, "_monitor_candidates")
    except AttributeError:
        pass
    else:
        save(trainer, candidates(trainer))
        return
    _lost(
        "ModelCheckpoint._save_topk_checkpoint",
        "a checkpoint the engine saves itself (at a signal, at an epoch's end) is written by "
        "Trainer.save_checkpoint, and the callback's best_model_path and loggers do not hear of it.",
    )
    metrics = {**trainer.callback_metrics, "epoch": trainer.current_epoch, "step": trainer.global_step}
    trainer.save_checkpoint(checkpoint.format_checkpoint_name(metrics))


def saved_loader_states(checkpoint: dict) -> list | None:
    """The training dataloaders' states that Lightning saved in ``checkpoint`` (a loaded
    checkpoint dict), one per loader with a ``state_dict``; None where it holds none.

    Lightning's checkpoint layout: ``checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]``.
    """
    return checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {}).get("combined_loader")


def ddp_logging_data(ddp: "DistributedDataParallel") -> dict[str, Any]:
    """DDP's own record of its settings: constructor arguments, ``comm_hook`` (the registered
    hook's name), ``bucket_sizes`` and, once DDP has rebuilt its buckets (``has_rebuilt_buckets``),
    ``rebuilt_bucket_sizes`` (each a comma-separated string of bytes), ``has_sync_bn``; and its
    runtime statistics of the latest iteration it sampled (:func:`sample_ddp_runtime_every`):
    ``iteration`` (its number, from 1, counting the forward passes that synchronize gradients),
    ``forward_compute_time`` (from the forward's start to the backward's), ``backward_compute_time``
    (to the last gradient ready), ``backward_comm_time`` (from the first bucket's AllReduce to the
    last one's end) and ``backward_compute_comm_overlap_time`` (the part of it before the last
    gradient was ready), in nanoseconds: CUDA events on GPUs, the host clock on CPU.

    torch's ``DistributedDataParallel._get_ddp_logging_data()``; an empty dict, said once, where
    torch has no such method or it fails: ``ddp.json`` then lacks the registered hook's name (the
    buckets' bytes are counted from the parameters: :func:`ddp_bucket_bytes`), and the step anatomy
    lacks DDP's timings.
    """
    try:
        data = dict(_private(ddp, "_get_ddp_logging_data")())
    except (AttributeError, RuntimeError, TypeError):
        data = {}
    if "bucket_sizes" not in data:  # gone, or no longer the record described above
        _lost(
            "DistributedDataParallel._get_ddp_logging_data",
            "ddp.json names no communication hook nor bucket sizes, and the step anatomy has no DDP timings.",
        )
        return {}
    return data


def sample_ddp_runtime_every(ddp: "DistributedDataParallel", iterations: int) -> None:
    """Have DDP time (:func:`ddp_logging_data`) its first 10 iterations and then every
    ``iterations``-th (torch's default: every 100th). The statistics of an iteration are recorded
    at the start of the next one's forward.

    torch's ``DistributedDataParallel._set_ddp_runtime_logging_sample_rate``; where torch has no
    such method (or it fails), DDP keeps its default sampling, said once.
    """
    try:
        _private(ddp, "_set_ddp_runtime_logging_sample_rate")(iterations)
    except (AttributeError, RuntimeError, TypeError):
        _lost(
            "DistributedDataParallel._set_ddp_runtime_logging_sample_rate",
            "DDP times its iterations at its own default rate (the step anatomy has fewer windows).",
        )


def process_group_timeout(device: "torch.device") -> timedelta | None:
    """The timeout the default process group was built with, for its backend on ``device``; None,
    said once, where torch no longer keeps it there (``ddp.json``'s ``timeout_s`` is then null).

    torch's ``Backend.Options._timeout``; the backend from ``torch.distributed.get_backend_impl``,
    or ``ProcessGroup._get_backend`` where torch has no such function (before 2.14).
    """
    import torch.distributed as dist

    try:
        if hasattr(dist, "get_backend_impl"):
            backend = dist.get_backend_impl(device=device)
        else:
            backend = _private(dist.group.WORLD, "_get_backend")(device)
        timeout = _private(backend.options, "_timeout")
    except (AttributeError, RuntimeError):
        timeout = None
    if not isinstance(timeout, timedelta):
        _lost("Backend.Options._timeout", "ddp.json gives no process group timeout (timeout_s: null).")
        return None
    return timeout


def tensorboard_file_writer(writer: "SummaryWriter") -> "FileWriter | None":
    """The file writer of ``writer`` (its event file), opened again if ``writer`` was closed: its
    ``add_summary`` writes a summary built elsewhere.

    torch's ``SummaryWriter._get_file_writer()``; where it is gone (said once), the public
    ``file_writer`` attribute, None once ``writer`` is closed: the caller then writes nothing.
    """
    try:
        return _private(writer, "_get_file_writer")()
    except AttributeError:
        pass
    _lost(
        "SummaryWriter._get_file_writer",
        "TensorBoard summaries built by the engine (HPARAMS, figures, the resume's purge) are written "
        "only while the writer is open.",
    )
    return writer.file_writer


def declared_type(node: "DictConfig", key: str) -> type | Any | None:
    """The type that ``node``'s schema declares for ``key`` (``Any`` for an untyped key), also
    where its value is null; None when ``node`` has no such key.

    OmegaConf's ``node._get_node(key)._metadata.ref_type``; None, said once, where OmegaConf's nodes
    no longer have it: an unknown key under a node set to null (a logger the command line selects,
    while another of its values is refused) is refused without the list of the keys its schema has.
    """
    if key not in node:
        return None
    try:
        return _private(_private(node, "_get_node")(key), "_metadata").ref_type
    except AttributeError:
        _lost(
            "OmegaConf's Node._metadata.ref_type",
            "an unknown key under a node set to null is refused without the list of the keys its schema has.",
        )
        return None


def submitit_sbatch_script(executor: Any, job_count: int) -> str | None:
    """The batch script that submitit's SLURM ``executor`` (an ``AutoExecutor``) submits for a job
    array of ``job_count`` jobs, without submitting it.

    submitit's ``_make_sbatch_string``, with its SlurmExecutor's (``AutoExecutor._executor``) parameters
    and command (``_submitit_command_str``), as ``SlurmExecutor._internal_process_submissions`` passes them.
    None, said once, where submitit no longer has them (or takes other arguments): the script cannot
    be shown; a sweep submits through submitit's public ``map_array``, without it.
    """
    try:
        from submitit.slurm import slurm as submitit_slurm

        slurm = _private(executor, "_executor")
        parameters = {**slurm.parameters, "map_count": job_count}
        command = _private(slurm, "_submitit_command_str")
        return _private(submitit_slurm, "_make_sbatch_string")(command=command, folder=slurm.folder, **parameters)
    except (ImportError, AttributeError, TypeError):
        _lost(
            "submitit's _make_sbatch_string, AutoExecutor._executor or SlurmExecutor._submitit_command_str",
            "the batch script of a SLURM sweep cannot be shown without submitting it (the sweep itself submits).",
        )
        return None


def retarget_lr_scheduler(
    scheduler: "torch.optim.lr_scheduler.LRScheduler", optimizer: "torch.optim.Optimizer"
) -> None:
    """Move ``scheduler`` onto ``optimizer``, which has the same parameter groups as the one it was
    built for: it then sets the learning rate in ``optimizer``'s groups, and sees its steps.

    torch's ``LRScheduler.__init__`` wraps its optimizer's ``step`` to mark that it was called (the
    optimizer's ``_opt_called``, the wrapper's ``_wrapped_by_lr_sched``), and warns on its first
    ``step()`` when the mark is missing. This wraps ``optimizer.step`` (on the instance) the same way.
    """
    import functools

    scheduler.optimizer = optimizer
    step = optimizer.step
    if hasattr(step, "_wrapped_by_lr_sched"):
        return

    @functools.wraps(step)
    def tracked_step(*args: Any, **kwargs: Any) -> Any:
        setattr(optimizer, "_opt_called", True)  # noqa: B010 (a private name: no attribute syntax outside _private)
        return step(*args, **kwargs)

    setattr(tracked_step, "_wrapped_by_lr_sched", True)  # noqa: B010 (as above)
    optimizer.step = tracked_step


def release_consolidated_state(optimizer: "ZeroRedundancyOptimizer") -> None:
    """Free the copy of every rank's optimizer state that ``consolidate_state_dict`` gathered on
    this rank (the target rank only holds one), once the checkpoint made of it is written; the next
    checkpoint consolidates afresh.

    torch's ``ZeroRedundancyOptimizer._all_state_dicts`` (a list, empty on the other ranks); where
    it is gone (said once), the copy stays until torch frees it.
    """
    try:
        _replace(optimizer, "_all_state_dicts", [])
    except AttributeError:
        _lost(
            "ZeroRedundancyOptimizer._all_state_dicts",
            "rank 0 keeps the consolidated optimizer state of all ranks between checkpoints.",
        )


def zero_partition(optimizer: "ZeroRedundancyOptimizer") -> "list[list[torch.Tensor]] | None":
    """The parameters each rank of ``optimizer``'s process group keeps the state of (ZeRO-1), rank by
    rank: torch's ``ZeroRedundancyOptimizer._partition_parameters()`` (each rank's parameter groups);
    None, said once, where torch no longer has it."""
    try:
        groups_per_rank = _private(optimizer, "_partition_parameters")()
        return [[param for group in groups for param in group["params"]] for groups in groups_per_rank]
    except (AttributeError, TypeError, KeyError):
        _lost(
            "ZeroRedundancyOptimizer._partition_parameters",
            "the plan gives ZeRO-1's optimizer state of its own rank only, not the largest rank's.",
        )
        return None


def init_fake_process_group(rank: int, world_size: int) -> bool:
    """Form torch's fake process group as ``rank`` of ``world_size`` in this process alone (its
    collectives move nothing): the public ``Backend.FAKE`` of torch 2.14, whose
    ``init_process_group`` makes its own store; on older releases the backend and its store of
    ``torch.testing._internal.distributed.fake_pg``. Returns False, said once, where neither is there
    (no group is formed)."""
    import importlib

    import torch.distributed as dist

    if hasattr(dist.Backend, "FAKE"):
        dist.init_process_group(dist.Backend.FAKE, rank=rank, world_size=world_size)
        return True
    try:
        fake_pg = importlib.import_module("torch.testing._internal.distributed.fake_pg")
        store = fake_pg.FakeStore()
    except (ImportError, AttributeError):
        _lost("torch.distributed.Backend.FAKE", "the plan runs no training step as its rank over a fake process group.")
        return False
    dist.init_process_group("fake", store=store, rank=rank, world_size=world_size)
    return True


def run_exit_handlers() -> bool:
    """Run this process's ``atexit`` handlers now, as the interpreter does at a normal exit (each
    once: the list is then empty); returns whether they ran. For a process that ends with
    ``os._exit``: a worker that ``multiprocessing`` started, a command's own process
    (:func:`~ddp_engine.core.lifetime.exit_without_teardown`).

    Python's ``atexit._run_exitfuncs()``; where Python has no such function (or it takes other
    arguments), False, said once: a command's process then ends through the normal exit, which
    runs them, and a worker's do not run (W&B's: its run is not finished, its last values not sent).
    """
    import atexit

    try:
        _private(atexit, "_run_exitfuncs")()
    except (AttributeError, TypeError):
        _lost(
            "atexit._run_exitfuncs",
            "the exit handlers of a process that ends with os._exit (a DDP worker) do not run: W&B's run "
            "is not finished and its last values are not sent; a command's own process ends through the "
            "interpreter's normal exit, about 1.3 s longer.",
        )
        return False
    return True


def start_forkserver(context: "BaseContext") -> None:
    """Start the forkserver of ``multiprocessing``'s ``forkserver`` ``context`` now, in this thread,
    with the modules set by ``context.set_forkserver_preload``; nothing when it is running. The
    kernel ends a process started with ``PR_SET_PDEATHSIG`` (the forkservers of
    :mod:`ddp_engine.launch.forkserver_preload` and :mod:`ddp_engine.data.loader_forkserver`) when
    the thread that started it ends: the thread matters.

    Python's ``multiprocessing.forkserver.ensure_running()``, which returns at once, while the
    forkserver imports its modules (torch, Lightning: seconds). Where Python has no such function,
    a process that does nothing is started through ``context`` and joined, which starts the
    forkserver in this thread too (and, with it running, costs 5 to 25 ms), but returns only once
    the forkserver has imported its modules, said once: the command waits for them instead of
    going on meanwhile.
    """
    from multiprocessing import forkserver

    try:
        ensure_running = _private(forkserver, "ensure_running")
    except AttributeError:
        _lost(
            "multiprocessing.forkserver.ensure_running",
            "the forkserver is started by a process that does nothing, and the command waits for its "
            "imports (torch, Lightning: seconds) instead of going on meanwhile.",
        )
        process = context.Process(name="start the forkserver")
        process.start()
        process.join()
        return
    ensure_running()


def start_resource_tracker_with_sighup_blocked() -> None:
    """Start Python's resource tracker (the process that unlinks the semaphores and shared memory
    of ``multiprocessing``'s children once they are gone, started with a forkserver) now, with
    SIGHUP blocked, which it keeps for its life: a closed terminal's SIGHUP, sent to the command's
    whole process group, does not end it. This thread gets a SIGHUP sent meanwhile right after.

    Python's ``multiprocessing.resource_tracker.ensure_running()``. Where Python has no such
    function, nothing is started here (the forkserver starts the tracker, as it does by itself),
    and nothing else is started with SIGHUP blocked (a process started so would keep it blocked,
    and pass it on to the ranks), said once: a closed terminal may end the tracker, and each
    process that ends after it then prints a KeyError traceback from the tracker started anew.
    """
    import signal
    from multiprocessing import resource_tracker

    try:
        ensure_running = _private(resource_tracker, "ensure_running")
    except AttributeError:
        _lost(
            "multiprocessing.resource_tracker.ensure_running",
            "Python's resource tracker is started without SIGHUP blocked: after a closed terminal, each "
            "worker that ends may print a KeyError traceback from the tracker.",
        )
        return
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def name_rendezvous_events_by_frame() -> bool:
    """Make torch's c10d rendezvous (``rdzv_backend="c10d"``, the supervisor's) name the events it
    records (``DynamicRendezvousHandler.next_rendezvous``, ...) from the caller's frame, the same
    name, instead of through ``inspect.stack()``; returns whether it did.

    Why: ``inspect.stack()`` reads every frame's source and maps each to its module, scanning all
    of ``sys.modules`` for a frame it cannot map; in the supervisor, which has imported Lightning
    (about 4,000 modules), the records of one rendezvous took 0.3 to 0.6 s before the workers
    started, on a 2-core machine (torch 2.14.1). The same change made elsewhere in torch:
    pytorch/pytorch#105940, #114700 (``sys._getframe`` for ``inspect.stack()``).

    Replaces torch's module-level ``dynamic_rendezvous.get_method_name(depth=2)``, which
    ``_record`` calls: the name of the function ``depth`` frames above it. Where torch has no such
    function, or one with other parameters, nothing is replaced (a name torch no longer calls
    would be set for nothing), said once: the rendezvous takes its 0.3 to 0.6 s.
    """
    import inspect
    import sys

    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous

        parameters = list(inspect.signature(_private(dynamic_rendezvous, "get_method_name")).parameters)
    except (ImportError, AttributeError, TypeError, ValueError):
        parameters = None
    if parameters != ["depth"]:
        _lost(
            "torch.distributed.elastic.rendezvous.dynamic_rendezvous.get_method_name",
            "the rendezvous names its events through inspect.stack(): the workers start 0.3 to 0.6 s later.",
        )
        return False

    def get_method_name(depth: int = 2) -> str:
        # depth counts from this function, as inspect.stack()[depth]; sys._getframe is documented (CPython).
        frame = sys._getframe(depth)  # noqa: SLF001
        return frame.f_code.co_name

    _replace(dynamic_rendezvous, "get_method_name", get_method_name)
    return True


def tell_hydra_the_mode(mode: Any) -> bool:
    """Make Hydra's main take ``mode`` as the command's ``hydra.mode`` (``RunMode.RUN``,
    ``RunMode.MULTIRUN``, or None when the config leaves it unset: then ``-m`` decides, as in
    Hydra) instead of composing the config to read it; returns whether it did.

    Why: before it composes the config to run it, Hydra's main composes it once more only to read
    ``hydra.mode`` (``Hydra.get_mode``, hydra 1.3; Hydra issue #3440); the command has
    composed every job of its command line to check it (:mod:`ddp_engine.config.compose`), and
    knows the value: 0.25 to 0.3 s less before the workers start, on a 2-core machine.

    Replaces Hydra's ``hydra._internal.hydra.Hydra.get_mode(self, config_name, overrides)``. Where
    Hydra has no such method, or one with other parameters, nothing is replaced (Hydra's main would
    call it otherwise, or not at all), said once: Hydra composes the config twice, as it does by itself.
    """
    import inspect

    try:
        from hydra._internal.hydra import Hydra

        parameters = list(inspect.signature(_private(Hydra, "get_mode")).parameters)
    except (ImportError, AttributeError, TypeError, ValueError):
        parameters = None
    if parameters != ["self", "config_name", "overrides"]:
        _lost(
            "hydra._internal.hydra.Hydra.get_mode",
            "Hydra composes the config once more to read hydra.mode: the workers start 0.25 to 0.3 s later.",
        )
        return False

    def get_mode(self: Any, config_name: str | None, overrides: list[str]) -> Any:
        return mode

    _replace(Hydra, "get_mode", get_mode)
    return True
