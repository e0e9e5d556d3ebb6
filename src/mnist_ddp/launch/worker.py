"""One DDP process of a job that the supervisor started (:mod:`mnist_ddp.launch.supervisor`).

``python -m mnist_ddp.launch.worker <run dir>/.hydra/job.yaml``: torch's elastic agent starts one per
device, with ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set, so
Lightning sees a ``TorchElasticEnvironment`` and starts no process itself. The worker reads the
job's config and logging config from the job file and runs the job's task
(``mnist_ddp.run.train:fit_and_test``, ``mnist_ddp.run.evaluate:evaluate``).

Every way a worker can end is bounded:

- an exception is logged (``train.log``, with the rank) and recorded in torch's error file, which
  the supervisor reads to name the failure; exit status 1;
- SIGINT / SIGTERM (from the supervisor, when the user stops the run or another worker failed)
  stop it through Lightning's Ctrl-C path (:mod:`mnist_ddp.callbacks.signals`); the signal first writes
  every thread's Python stack to ``.stacks/rank<r>.txt`` in the run directory (kept when a
  collective timed out: see :func:`mnist_ddp.launch.supervisor.collect_stacks`), and a watchdog thread ends
  the process after ``launcher.shutdown_timeout`` seconds if it is still blocked (in a collective,
  a rendezvous: C++ code where Python's signal handlers cannot run);
- the supervisor's death (even SIGKILL) sends the worker SIGTERM (Linux ``PR_SET_PDEATHSIG``).
"""

import faulthandler
import importlib
import logging
import logging.config
import os
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from mnist_ddp.core.lifetime import end_with_parent

log = logging.getLogger(__name__)

#: Set in each worker's environment by the supervisor: its pid.
SUPERVISOR_ENV = "MNIST_DDP_SUPERVISOR_PID"
#: Where in the run directory each worker writes its stacks when it is stopped (``rank<r>.txt``).
STACKS_DIR = ".stacks"


def end_with_supervisor() -> None:
    """Have the kernel send this process SIGTERM when the supervisor dies, however it dies.

    Raises:
        SystemExit: if the supervisor is already gone (it died before the request took effect).
    """
    end_with_parent(int(os.environ[SUPERVISOR_ENV]), "supervisor")


class TerminationWatchdog:
    """Ends the process with status 128 + the signal when it is still running ``grace`` seconds
    after SIGINT, SIGTERM or SIGHUP.

    Python runs a signal handler only between bytecodes of the main thread, so a process blocked in
    C++ (a collective, a rendezvous) would ignore the signal until that call times out. The
    signal's number still reaches this thread at once, through ``signal.set_wakeup_fd``, which
    Python's C-level handler writes to whenever a Python-level handler is installed (the run's
    :class:`~mnist_ddp.callbacks.signals.StopOnSignal` handlers are).

    Args:
        grace: seconds the process has to end by itself (``launcher.shutdown_timeout``).
    """

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self._reader, self._writer = socket.socketpair()  # the writer stays open for the process's life
        self._writer.setblocking(False)
        signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="termination-watchdog", daemon=True).start()

    def _watch(self) -> None:
        while (signum := self._reader.recv(1)[0]) not in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            pass
        time.sleep(self.grace)
        log.error(
            f"Still running {self.grace:g} s after {signal.Signals(signum).name} (blocked outside Python, in a "
            "collective or the rendezvous): ending it."
        )
        os._exit(128 + signum)


def write_stacks(path: Path, error: BaseException) -> None:
    """Write where ``error`` was raised (its traceback) and every thread's current stack to ``path``."""
    with open(path, "w") as file:
        file.write(f"Rank {os.environ.get('RANK')} (pid {os.getpid()}) failed: {type(error).__name__}: {error}\n")
        file.write("".join(traceback.format_exception(error)))
        file.write("\nStacks of every thread now, most recent call first:\n")
        file.flush()
        faulthandler.dump_traceback(file, all_threads=True)


def record_atomically(handler: Any, error: BaseException) -> None:
    """Write ``error`` into this worker's error file (``TORCHELASTIC_ERROR_FILE``, which the agent
    reads when the worker has ended) as torch's ``ErrorHandler`` writes it, but complete or not
    at all: the handler writes the file in place, and a worker ended during the write (the agent's
    SIGTERM, the watchdog) left it empty, which the agent's reader fails on with a traceback
    instead of naming the failure."""
    final = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if final is None:
        handler.record_exception(error)
        return
    from mnist_ddp.core.files import atomic_path

    try:
        with atomic_path(Path(final)) as partial:
            os.environ["TORCHELASTIC_ERROR_FILE"] = str(partial)
            handler.record_exception(error)
    finally:
        os.environ["TORCHELASTIC_ERROR_FILE"] = final


def end_quietly_until_started() -> None:
    """Until the run's own handlers are installed: SIGINT, SIGTERM and SIGHUP end this process at
    once, with status 128 + the signal and no traceback (nothing is trained yet, nothing to save)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda number, frame: os._exit(128 + number))


def end_process_group() -> None:
    """After the task: wait for every rank to finish its own, then destroy the process group.

    A rank that exits with its process group alive while a peer still works (global rank 0 draws
    the test figures after the others are done) can be aborted at interpreter exit by the
    backend's threads (SIGABRT, "terminate called without an active exception"); torch's
    documentation asks for ``destroy_process_group()`` before a process exits.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def main() -> None:
    """Run the job file's task in this process; see the module's docstring for how it ends."""
    # First, before the imports of torch and Lightning (seconds): a supervisor killed meanwhile
    # must take this process with it.
    end_quietly_until_started()
    end_with_supervisor()
    from omegaconf import OmegaConf
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    from mnist_ddp.callbacks.signals import dump_stacks_on_stop_signals
    from mnist_ddp.core.errors import UsageError
    from mnist_ddp.distributed.failures import PEER_LOST_PATTERN, TIMEOUT_PATTERN

    job = OmegaConf.load(sys.argv[1])
    # The job's config as a root of its own: its interpolations (${seed}) resolve against it.
    config = OmegaConf.create(OmegaConf.to_container(job.config))
    logging.config.dictConfig(OmegaConf.to_container(job.logging))
    # Warnings go through logging: tagged with the rank, kept in the job's log file.
    logging.captureWarnings(True)
    rank = int(os.environ["RANK"])
    stacks_file = Path(config.paths.output_dir) / STACKS_DIR / f"rank{rank}.txt"
    stacks_file.parent.mkdir(parents=True, exist_ok=True)
    dump_stacks_on_stop_signals(open(stacks_file, "w"))  # noqa: SIM115 -- open for the process's life
    TerminationWatchdog(grace=config.launcher.shutdown_timeout)
    module, _, function = job.task.partition(":")
    task = getattr(importlib.import_module(module), function)
    try:
        task(config)
        end_process_group()
    except SystemExit as stopped:
        if stopped.code in {128 + signum for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}:
            # Stopped by a signal: Lightning has torn the run down and its logger flushed, and the
            # stop is logged. The interpreter's own shutdown (torch, Lightning, threads) takes
            # seconds on a busy machine, and the run must end within launcher.shutdown_timeout.
            logging.shutdown()
            os._exit(stopped.code)
        raise
    except BaseException as error:  # noqa: B036 -- every way out is recorded for the supervisor
        if isinstance(error, UsageError):
            log.error(f"{type(error).__name__}: {error}")
        elif TIMEOUT_PATTERN.search(str(error)):  # its traceback goes into hang-rank<r>.txt
            log.error(f"Rank {rank} failed waiting for the other ranks: {type(error).__name__}: {error}")
        elif PEER_LOST_PATTERN.search(str(error)):
            log.error(f"Rank {rank} stopped: another process of the job ended ({type(error).__name__}: {error})")
        else:
            log.exception(f"Rank {rank} failed")
        if TIMEOUT_PATTERN.search(str(error)):
            write_stacks(Path(config.paths.output_dir) / f"hang-rank{rank}.txt", error)
        record_atomically(ErrorHandler(), error)
        sys.exit(1)


if __name__ == "__main__":
    main()
