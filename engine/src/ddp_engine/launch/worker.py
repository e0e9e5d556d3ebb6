"""One DDP process of a job that the supervisor started (:mod:`ddp_engine.launch.supervisor`).

:func:`run` with ``<run dir>/.hydra/job.yaml``: torch's elastic agent forks one per device from the
job's forkserver (:mod:`ddp_engine.launch.forkserver_preload`, which has imported the task's
modules), with ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set, so
Lightning sees a ``TorchElasticEnvironment`` and starts no process itself. In ``ps`` it reads
``ddp_engine.launch.worker <job file> (rank <r>)``. The worker reads the job's config and logging
config from the job file and runs the job's task (``ddp_engine.run.train:fit_and_test``,
``ddp_engine.run.evaluate:evaluate``).

Every way a worker can end is bounded:

- an exception is logged (``train.log``, with the rank) and recorded in torch's error file, which
  the supervisor reads to name the failure; exit status 1;
- SIGINT / SIGTERM (from the supervisor, when the user stops the run or another worker failed)
  stop it through Lightning's Ctrl-C path (:mod:`ddp_engine.callbacks.signals`); the signal first writes
  every thread's Python stack to ``.stacks/rank<r>.txt`` in the run directory (kept when a
  collective timed out: see :func:`ddp_engine.launch.supervisor.collect_stacks`), and a watchdog thread ends
  the process after ``launcher.shutdown_timeout`` seconds if it is still blocked (in a collective,
  a rendezvous: C++ code where Python's signal handlers cannot run);
- the supervisor's death (even SIGKILL) ends the forkserver, and the forkserver's death sends the
  worker SIGTERM (Linux ``PR_SET_PDEATHSIG``, both).
"""

import faulthandler
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

from ddp_engine.core.compat import run_exit_handlers
from ddp_engine.core.console import drop_output_when_closed
from ddp_engine.core.lifetime import STOP_SIGNALS, end_with_parent
from ddp_engine.task import imported

log = logging.getLogger(__name__)

#: Where in the run directory each worker writes its stacks when it is stopped (``rank<r>.txt``).
STACKS_DIR = ".stacks"
#: Seconds a worker that only lost another process of the job (a collective's lost connection)
#: waits before it exits, so that the supervisor names the process that was lost.
CONSEQUENCE_DELAY = 1.0


def run(job_file: str, environ: dict[str, str]) -> None:
    """What torch's elastic agent runs in each worker: :func:`main`, in the supervisor's environment.

    Args:
        job_file: the job file (:func:`ddp_engine.launch.supervisor.write_job_file`).
        environ: the supervisor's environment when it launched the workers (the job's
            ``launcher.env`` among it). The forkserver's own is older, from before the command's
            values were checked; the agent's variables for this rank are kept over it.

    Raises:
        RuntimeError: when the process was not forked from the job's forkserver.
        SystemExit: 128 + SIGTERM at once, when the forkserver is already gone.
    """
    from ddp_engine.launch import forkserver_preload

    if forkserver_preload.FORKSERVER_PID == os.getpid():  # imported here, not inherited from the forkserver
        raise RuntimeError("ddp_engine.launch.worker.run runs in a process forked from the job's forkserver only")
    # First, as the worker's life starts: a stop signal ends it quietly, and so does the forkserver's end.
    end_quietly_on_stop_signals()
    end_with_parent(forkserver_preload.FORKSERVER_PID, "forkserver")
    drop_output_when_closed()  # a closed console (| head) does not end the run: see there
    import torch.distributed
    from lightning.fabric.utilities.rank_zero import rank_zero_only
    from setproctitle import setproctitle

    agent = {key: value for key, value in os.environ.items() if forkserver_preload.ENVIRON.get(key) != value}
    os.environ.clear()
    os.environ.update({**environ, **agent})
    # What the forkserver's imports read from its older environment, read again from this one:
    # Lightning the rank (in the forkserver, rank 0), torch.distributed TORCH_DISTRIBUTED_DEBUG
    # (debug=ddp sets it through launcher.env, which the supervisor applies after the forkserver starts).
    rank_zero_only.rank = int(os.environ["RANK"])
    torch.distributed.set_debug_level_from_env()
    # multiprocessing makes a process started by a forkserver start its own children through a
    # forkserver too (spawn.prepare sets the parent's start method), one that nothing ties to this
    # process: it and its children can outlive it, holding the command's output open. Back to
    # Linux's default, as a process started by a command has, for a child started with the default
    # context; the engine's DataLoaders start their workers from a forkserver of their own that ends
    # with this process (ddp_engine.data.loader_workers).
    import multiprocessing

    multiprocessing.set_start_method("fork", force=True)
    setproctitle(f"ddp_engine.launch.worker {job_file} (rank {os.environ['RANK']})")
    try:
        main(job_file)
    finally:
        # multiprocessing ends this process with os._exit: the exit handlers a command's process
        # runs (W&B's finishes its run, with the test's values) would not run. (On a Python that
        # cannot run them here, they do not: compat says so once, and the worker ends as it would.)
        run_exit_handlers()


class TerminationWatchdog:
    """Ends the process with status 128 + the signal when it is still running ``grace`` seconds
    after SIGINT, SIGTERM or SIGHUP.

    Python runs a signal handler only between bytecodes of the main thread, so a process blocked in
    C++ (a collective, a rendezvous) would ignore the signal until that call times out. The
    signal's number still reaches this thread at once, through ``signal.set_wakeup_fd``, which
    Python's C-level handler writes to whenever a Python-level handler is installed (the run's
    :class:`~ddp_engine.callbacks.signals.StopOnSignal` handlers are).

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
    from ddp_engine.core.files import atomic_path

    try:
        with atomic_path(Path(final)) as partial:
            os.environ["TORCHELASTIC_ERROR_FILE"] = str(partial)
            handler.record_exception(error)
    finally:
        os.environ["TORCHELASTIC_ERROR_FILE"] = final


def end_quietly_on_stop_signals() -> None:
    """While the worker has nothing to save (until the run's own handlers are installed, and once
    its task has returned): SIGINT, SIGTERM and SIGHUP end this process at once, with status
    128 + the signal and no traceback. After the task, Ctrl-C met a worker in its last barrier
    (:func:`end_process_group`), whose peer had stopped: it was reported as the rank that failed.
    A signal ignored so far is handled too (unlike a command's start,
    :func:`~ddp_engine.core.lifetime.end_at_once_on_stop_signals`): the forkserver ignores SIGHUP,
    which the agent passes on to the workers."""
    for signum in STOP_SIGNALS:
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


def main(job_file: str) -> None:
    """Run the task of ``job_file`` in this process; see the module's docstring for how it ends.

    Raises:
        SystemExit: 1 when the task failed (recorded in torch's error file), 128 + the signal when
            it was stopped.
    """
    from omegaconf import OmegaConf
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    from ddp_engine.callbacks.signals import dump_stacks_on_stop_signals
    from ddp_engine.core.errors import UsageError
    from ddp_engine.core.files import NoSpaceError, write_json
    from ddp_engine.core.run_dir import METRICS_FILE
    from ddp_engine.distributed.failures import PEER_LOST_PATTERN, TIMEOUT_PATTERN

    job = OmegaConf.load(job_file)
    # The job's config as a root of its own: its interpolations (${seed}) resolve against it.
    config = OmegaConf.create(OmegaConf.to_container(job.config))
    logging.config.dictConfig(OmegaConf.to_container(job.logging))
    # A log line that cannot be written (a full disk) is lost, not printed as a traceback of its own.
    logging.raiseExceptions = False
    # Warnings go through logging: tagged with the rank, kept in the job's log file.
    logging.captureWarnings(True)
    rank = int(os.environ["RANK"])
    stacks_file = Path(config.paths.output_dir) / STACKS_DIR / f"rank{rank}.txt"
    stacks_file.parent.mkdir(parents=True, exist_ok=True)
    dump_stacks_on_stop_signals(open(stacks_file, "w"))  # noqa: SIM115 -- open for the process's life
    TerminationWatchdog(grace=config.launcher.shutdown_timeout)
    task = imported(job.task)
    try:
        results = task(config)
        if rank == 0:  # global rank 0's results, which the supervisor reads back from the run directory
            write_json(Path(config.paths.output_dir) / METRICS_FILE, results)
        end_quietly_on_stop_signals()  # its results are written: a stop now only ends it
        end_process_group()
    except SystemExit as stopped:
        if stopped.code in {128 + signum for signum in STOP_SIGNALS}:
            # Stopped by a signal: Lightning has torn the run down and its logger flushed, and the
            # stop is logged. The interpreter's own shutdown (torch, Lightning, threads) takes
            # seconds on a busy machine, and the run must end within launcher.shutdown_timeout.
            logging.shutdown()
            os._exit(stopped.code)
        raise
    except BaseException as error:  # noqa: B036 -- every way out is recorded for the supervisor
        if isinstance(error, UsageError | NoSpaceError):  # one line says it all: no traceback
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
        if PEER_LOST_PATTERN.search(str(error)):
            # The agent reports the first failure it sees (start_method="forkserver": one, not all):
            # the rank that was lost must end first, not this consequence of it. The agent polls
            # every 0.1 s and then stops this process (SIGTERM) anyway.
            time.sleep(CONSEQUENCE_DELAY)
        sys.exit(1)
