"""Stopping a run from outside: Ctrl-C (SIGINT) and SIGTERM (``kill``, a scheduler's time limit).

Every DDP process stops within seconds, the last complete checkpoint stays intact (checkpoints
are written atomically, :mod:`mnist_ddp.checkpoint_io`), the log names it and how to resume, and
the command exits with 128 + the signal number (130, 143), as a shell reports a process killed
by a signal.
"""

import faulthandler
import logging
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TextIO

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

log = logging.getLogger(__name__)

#: The signals a run stops on: Ctrl-C, kill / a scheduler, a closed terminal or ssh session.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: The open file into which a stop signal first writes every thread's stack (see
#: :func:`dump_stacks_on_stop_signals`), or None. Module-level: Lightning replaces signal handlers at
#: each stage's start, and :meth:`StopOnSignal.install` must then put the dump back in front.
_stacks_file: TextIO | None = None


def dump_stacks_on_stop_signals(file: TextIO) -> None:
    """From now on, SIGINT and SIGTERM first write every thread's Python stack into ``file``, then
    run the handler they had (faulthandler's C-level dump, chained): at the moment the signal
    arrives, even while the main thread is blocked in C++ where no Python handler can run. The
    stacks show where a process was stopped: for a hang, what the rank that never reached the
    collective was doing (:mod:`mnist_ddp.worker` sets this up in every process it runs)."""
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
    waits in them until the process group's timeout (``strategy.timeout``, 30 minutes): 1 of 6
    SIGTERMs sent at random times to a 2-process gloo run hung that way. So here both signals
    raise KeyboardInterrupt.

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
        self.received = signal.Signals(signum)
        raise KeyboardInterrupt(self.received.name)

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.install()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.install()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.install()

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.install()

    @rank_zero_only
    def report(self, trainer: L.Trainer) -> None:
        """Log how the run stopped and what resumes it (global rank 0)."""
        saved = [
            Path(path)
            for callback in trainer.checkpoint_callbacks
            for path in (callback.best_model_path, getattr(callback, "last_model_path", ""))
            if path and Path(path).is_file()
        ]
        where = f"{self.received.name} in epoch {trainer.current_epoch} at global step {trainer.global_step}"
        if saved:
            newest = max(saved, key=lambda path: path.stat().st_mtime)
            log.warning(
                f"Stopped by {where}. Last complete checkpoint: {newest}. Resume this run in place with: "
                f"python -m mnist_ddp.train hydra.run.dir={trainer.default_root_dir} ckpt_path=last"
            )
        else:
            log.warning(f"Stopped by {where}, before any checkpoint was saved: start the run again.")


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
