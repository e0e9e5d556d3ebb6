"""Stopping a run from outside: Ctrl-C (SIGINT), SIGTERM (``kill``, a scheduler's time limit),
SIGHUP, and SLURM's notice before a preemption or time limit (its requeue signal).

Every DDP process stops within seconds, the last complete checkpoint stays intact (checkpoints
are written atomically, :mod:`ddp_engine.distributed.checkpoint_io`), the log names it and how to resume, and
the command exits with 128 + the signal number (130, 143), as a shell reports a process killed
by a signal. On SLURM's requeue signal the run first saves ``last.ckpt`` at an optimizer step and
requeues its job, which resumes there exactly.
"""

import faulthandler
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TextIO

import lightning as L
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_only
from typing_extensions import override

from ddp_engine.core.compat import skip_sigterm_broadcast
from ddp_engine.core.environment import submitit_preempt_signal
from ddp_engine.core.errors import ConfigValueError
from ddp_engine.core.lifetime import STOP_SIGNALS
from ddp_engine.core.run_dir import restart_hint, resume_hint
from ddp_engine.distributed.checkpoint_io import LastCheckpoint, at_optimizer_step_boundary
from ddp_engine.distributed.resume_points import resume_point, with_global_step

log = logging.getLogger(__name__)


#: The open file into which a stop signal first writes every thread's stack (see
#: :func:`dump_stacks_on_stop_signals`), or None. Module-level: Lightning replaces signal handlers at
#: each stage's start, and :meth:`StopOnSignal.install` must then put the dump back in front.
_stacks_file: TextIO | None = None


def dump_stacks_on_stop_signals(file: TextIO) -> None:
    """From now on, SIGINT and SIGTERM first write every thread's Python stack into ``file``, then
    run the handler they had (faulthandler's C-level dump, chained): at the moment the signal
    arrives, even while the main thread is blocked in C++ where no Python handler can run. The
    stacks show where a process was stopped: for a hang, what the rank that never reached the
    collective was doing (:mod:`ddp_engine.launch.worker` sets this up in every process it runs)."""
    global _stacks_file
    _stacks_file = file
    _register_stack_dump()


def _register_stack_dump() -> None:
    if _stacks_file is not None:
        for signum in STOP_SIGNALS:
            # A registration that signal.signal displaced still counts as enabled, and registering
            # again would not put the dump back; unregistering restores the handler of that first
            # registration's time, so the current one is set again before the dump goes in front.
            handler = signal.getsignal(signum)
            faulthandler.unregister(signum)
            signal.signal(signum, handler)
            faulthandler.register(signum, _stacks_file, all_threads=True, chain=True)


class StopOnSignal(L.Callback):
    """SIGINT and SIGTERM both stop the run the way Lightning stops it on Ctrl-C.

    Lightning handles KeyboardInterrupt in every process without a collective, and every process
    exits. Its own SIGTERM handler instead
    runs a broadcast over the process group inside the signal handler; when the signal lands
    while another rank is inside an AllReduce, the two collectives do not match and every process
    waits in them until the process group's timeout (``strategy.timeout``, 30 minutes); SIGTERMs
    sent at random times to a 2-process gloo run hung it that way. So here both signals raise
    KeyboardInterrupt.

    The handlers are installed when each Trainer stage starts (after Lightning registers its own,
    which it restores when the stage ends), and around the whole job by :func:`stop_on_signals`,
    which also logs, on global rank 0, the signal, the epoch and step, and the newest checkpoint
    of the Trainer's checkpoint callbacks, and the command that resumes the run in place.

    Attributes:
        received: the signal that stopped the run, or None.
    """

    def __init__(self) -> None:
        self.received: signal.Signals | None = None

    def install(self) -> None:
        """Handle :data:`STOP_SIGNALS` in this process (the main thread)."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._interrupt)
        _register_stack_dump()  # signal.signal replaced it: in front again

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        self.stop(signum)

    def stop(self, signum: int) -> None:
        """Stop the run as ``signum`` does (from a handler, or code that decided to stop for it).

        Raises:
            KeyboardInterrupt: always: Lightning's path for a stop in every process.
        """
        self.received = signal.Signals(signum)
        raise KeyboardInterrupt(self.received.name)

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.install()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.install()
        # Before every training step Lightning broadcasts global rank 0's "received SIGTERM" flag,
        # which only its own SIGTERM handler sets. This callback replaces that handler (above), so
        # the flag is never set, and every process gets the signal itself (from the supervisor,
        # torchrun or SLURM): the broadcast carries nothing, and costs a tenth of a small model's
        # training step on gloo (benchmarks/per_step.py). engine/tests/launch/test_interrupts.py and
        # test_chaos.py stop runs by signal without it.
        skip_sigterm_broadcast(trainer)
        if getattr(trainer, "received_sigterm", False):  # Lightning's handler got one before install()
            self.stop(signal.SIGTERM)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.install()

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.install()

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.install()

    @rank_zero_only
    def report(self, trainer: L.Trainer) -> None:
        """Log how the run stopped (:func:`stop_point`) and what resumes it (global rank 0): the run's
        ``last.ckpt``, which the printed resume (``ckpt_path=last``) continues from; without one,
        the newest checkpoint the run saved; with its global step (:func:`with_global_step`)."""
        saved = [
            Path(path)
            for callback in trainer.checkpoint_callbacks
            for path in (callback.best_model_path, getattr(callback, "last_model_path", ""))
            if path and Path(path).is_file()
        ]
        where = stop_point(trainer, self.received)
        if (point := resume_point(trainer.default_root_dir)) is not None:
            saved = [point]  # what ckpt_path=last resumes from, whatever the best checkpoint's time
        if saved:
            newest = max(saved, key=lambda path: path.stat().st_mtime)
            log.warning(
                f"Stopped by {where}. Last complete checkpoint: {with_global_step(newest)}. "
                f"{resume_hint(trainer.default_root_dir)}"
            )
        else:
            restart = restart_hint(trainer.default_root_dir)
            log.warning(f"Stopped by {where}, before any checkpoint was saved. {restart}")


#: What a Trainer does outside its fit, as a stop's line names it.
STAGES = {TrainerFn.VALIDATING: "validation", TrainerFn.TESTING: "test", TrainerFn.PREDICTING: "prediction"}


def stop_point(trainer: L.Trainer, signum: signal.Signals) -> str:
    """Where ``signum`` stopped the run, as its log counts (epochs from 0, ``Epoch 0 done``):
    ``SIGINT in epoch 1 at global step 30`` while it trains (its validation included); in the
    validation or test of the best checkpoint after its training, ``SIGINT during the final test,
    after epoch 1 (global step 42)``; in a command that trains nothing (``python -m <project>.eval``),
    ``SIGINT during the test``."""
    if trainer.state.fn == TrainerFn.FITTING:
        return f"{signum.name} in epoch {trainer.current_epoch} at global step {trainer.global_step}"
    stage = STAGES.get(trainer.state.fn, str(trainer.state.fn))
    if trainer.global_step == 0:
        return f"{signum.name} during the {stage}"
    # Once fit has returned, current_epoch counts the epochs it completed.
    after = f"after epoch {trainer.current_epoch - 1} (global step {trainer.global_step})"
    return f"{signum.name} during the final {stage}, {after}"


@contextmanager
def stop_on_signals(trainer: L.Trainer) -> Iterator[None]:
    """Around a job's Trainer calls: the :class:`StopOnSignal` callback of ``trainer`` (if it has
    one) handles the signals also between the calls, and a stopped run exits with status
    128 + the signal number.

    Raises:
        SystemExit: with status 130 (SIGINT) or 143 (SIGTERM) when a signal stopped the run.
    """
    stopper = next((callback for callback in trainer.callbacks if isinstance(callback, StopOnSignal)), None)
    if stopper is None:
        yield
        return
    stopper.install()
    try:
        yield
    except (KeyboardInterrupt, SystemExit):
        if stopper.received is None:
            raise
        stopper.report(trainer)
        sys.exit(128 + stopper.received)
    finally:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
        _register_stack_dump()


class RequeueOnSlurmSignal(L.Callback):
    """On SLURM's requeue signal, save ``last.ckpt`` at the next optimizer step, requeue the job, stop.

    With ``#SBATCH --signal=SIGUSR1@90 --requeue`` SLURM signals every task 90 s before a time limit
    or preemption. Lightning's own handler (SLURMEnvironment's ``auto_requeue``) saves
    ``hpc_ckpt_<n>.ckpt`` inside the signal handler, which breaks an exact resume twice: it saves
    wherever the main thread was (after a step's optimizer update but before Lightning counts the
    batch done, the resume trains that batch again), and its save ends with a barrier over the
    process group, which does not match another rank's gradient AllReduce when the signal lands
    mid-step (the hang :class:`StopOnSignal` describes for SIGTERM). Here the handler only records
    the signal. At each optimizer-step boundary global rank 0's record is broadcast, so every rank
    saves at the same step: model, optimizer, loops and data position of an exact resume point, in
    the run's ``last.ckpt`` (:class:`~ddp_engine.distributed.checkpoint_io.LastCheckpoint`). Global rank 0 then
    runs ``scontrol requeue <job id>`` (Lightning's command, array jobs included); every rank stops as
    on a stop signal (exit status 128 + the signal), and the requeued job resumes from that
    checkpoint (:func:`ddp_engine.run.trainer.checkpoint_to_resume`).

    Active under SLURM when the cluster environment's ``auto_requeue`` is on (Lightning's default;
    its ``requeue_signal``, default SIGUSR1, is the signal; under submitit, ``hydra/launcher=slurm``,
    submitit's signal, SIGUSR2 by default: :func:`ddp_engine.core.environment.submitit_preempt_signal`).
    It then costs one broadcast of a bool per optimizer step; elsewhere nothing. A signal during
    validation is acted on at the next training step; one after the last training step changes
    nothing (the job ends by itself). The handler, once installed, stays for the process's life:
    SIGUSR1's default action ends a process.

    Raises:
        ConfigValueError: at setup when active and the run has no
            :class:`~ddp_engine.distributed.checkpoint_io.LastCheckpoint` (``callbacks.last_checkpoint``) to save.
    """

    def __init__(self) -> None:
        self.signal: signal.Signals | None = None
        self.received = False

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        environment = trainer.strategy.cluster_environment
        if self.signal is None and isinstance(environment, SLURMEnvironment) and environment.auto_requeue:
            if self._last_checkpoint(trainer) is None:
                raise ConfigValueError(
                    "callbacks.requeue_on_slurm_signal saves last.ckpt on SLURM's requeue signal, and the run has "
                    "no callbacks.last_checkpoint: put it back, or also remove callbacks.requeue_on_slurm_signal."
                )
            # Under submitit (hydra/launcher=slurm) SLURM sends submitit's signal (SIGUSR2), not
            # SIGUSR1. submitit put its own handler on it before the job's function ran (save its
            # submission, `scontrol requeue`, exit); this one replaces it, so that the job saves
            # last.ckpt at a step boundary and requeues once, by the `scontrol requeue` below.
            # The requeued job runs the same submission, in the same job directory, and resumes
            # from last.ckpt (SLURM_RESTART_COUNT: ddp_engine.run.trainer.checkpoint_to_resume).
            # Lightning is told the same signal, so that it leaves it to this handler too.
            if (preempt := submitit_preempt_signal()) is not None:
                environment.requeue_signal = preempt
            # Before Lightning registers its own handlers (after the setup hooks): it leaves a
            # signal that already has a handler alone.
            self.signal = signal.Signals(environment.requeue_signal)
            signal.signal(self.signal, self._record)

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.received = True

    @staticmethod
    def _last_checkpoint(trainer: L.Trainer) -> LastCheckpoint | None:
        return next((callback for callback in trainer.callbacks if isinstance(callback, LastCheckpoint)), None)

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if self.signal is None:
            return
        if not at_optimizer_step_boundary(trainer, batch_idx):
            return  # between accumulated micro-batches, whose gradients no checkpoint holds
        if not trainer.strategy.broadcast(self.received):
            return
        last = self._last_checkpoint(trainer)
        last.save(trainer)
        where = f"{self.signal.name} in epoch {trainer.current_epoch} at global step {trainer.global_step}"
        if trainer.is_global_zero:
            log.warning(
                f"SLURM's requeue signal {where}: saved {last.best_model_path}. {self._requeue(last.best_model_path)}"
            )
        trainer.strategy.barrier("requeue")  # no rank ends (which may end the job step) before the requeue
        stopper = next((callback for callback in trainer.callbacks if isinstance(callback, StopOnSignal)), None)
        if stopper is None:
            raise KeyboardInterrupt(self.signal.name)
        stopper.stop(self.signal)

    @staticmethod
    def _requeue(checkpoint: str) -> str:
        """Run ``scontrol requeue`` for this job; say what happened, and how to resume from ``checkpoint``
        if the job was not requeued."""
        if "SLURM_ARRAY_JOB_ID" in os.environ:
            job_id = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        else:
            job_id = os.environ["SLURM_JOB_ID"]
        try:
            status = subprocess.run(["scontrol", "requeue", job_id], check=False).returncode
        except FileNotFoundError:
            status = None
        if status == 0:
            return (
                f"Requeued SLURM job {job_id} (scontrol requeue): it resumes from this checkpoint when it runs again."
            )
        return (
            f"scontrol requeue {job_id} failed ({'no scontrol on PATH' if status is None else f'status {status}'}): "
            f"the job does not run again by itself; resume it with ckpt_path={checkpoint}."
        )
