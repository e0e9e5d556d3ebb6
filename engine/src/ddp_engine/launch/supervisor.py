"""Starting a job's DDP processes on one machine, and supervising them: torch's elastic agent.

``python -m <project>.train`` on its own (no torchrun, no SLURM) is the job's supervisor: it checks
the command line, prepares the data, writes the job's resolved config into the run directory, and
starts ``trainer.devices`` worker processes (:mod:`ddp_engine.launch.worker`) through torch's elastic agent
(``torch.distributed.launcher.api``, the agent behind torchrun). The workers run the job; this
process trains nothing, so it always stays responsive.

The agent forks the workers from a forkserver (``start_method="forkserver"``) that has imported
the job's modules (:func:`preload_workers`): torch, Lightning and torchmetrics take seconds to
import, once in the forkserver while this process checks the command's values, instead of once
per worker after the check. A forkserver, not ``fork`` from this process: it has not touched CUDA
or started threads (the agent's rendezvous store runs one here), which a forked child would inherit.

How the job ends:

- when any worker fails (an exception, SIGKILL, an OOM kill), the agent notices within 0.1 s and
  stops the others (SIGTERM, then SIGKILL after ``launcher.shutdown_timeout``), and
  :func:`launch` raises :class:`JobFailedError` naming the rank and its error;
- when this process gets SIGINT or SIGTERM, the agent passes the signal on to the workers, and
  :func:`launch` raises :class:`JobInterrupted`;
- when this process is SIGKILLed, the kernel sends the forkserver SIGTERM, and the forkserver's
  end sends each worker SIGTERM (``PR_SET_PDEATHSIG``, set by each).

Why not Lightning's own launcher: it runs global rank 0 in the command's own process and starts
the other ranks from it; when a child fails, its observer thread SIGKILLs every process it knows,
its own included. That ends a ``-m`` sweep with its first failing job, and rank 0, blocked in a
collective, cannot react to anything. Under torchrun or SLURM the launcher is theirs, and every
process runs the job itself (:func:`ddp_engine.core.environment.launched_externally`).
"""

import errno
import fcntl
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from multiprocessing.connection import Connection
from pathlib import Path
from traceback import format_exc
from typing import Any, TextIO

from omegaconf import DictConfig, ListConfig, OmegaConf

from ddp_engine.core.errors import ConfigValueError, JobFailedError
from ddp_engine.core.files import write_atomically
from ddp_engine.core.lifetime import SUPERVISOR_ENV, end_with_parent, on_stop_signals
from ddp_engine.distributed.failures import TIMEOUT_PATTERN, describe_failure, root_failure
from ddp_engine.launch.worker import STACKS_DIR
from ddp_engine.task import imported

log = logging.getLogger(__name__)

#: The job file in the run directory: what every worker runs, with the config resolved.
JOB_FILE = Path(".hydra") / "job.yaml"


class JobInterrupted(BaseException):
    """The supervisor got SIGINT, SIGTERM or SIGHUP and stopped every worker with it.

    A ``BaseException``, as ``KeyboardInterrupt``: raised by a signal handler wherever this
    process is (:func:`interrupt_job_on_stop_signals`), it must pass through the libraries' handlers
    of ``Exception`` unchanged (OmegaConf re-raises those as ``type(error)(message)``, which made it
    a ``ValueError`` with a traceback).

    Attributes:
        signum: the signal.
        workers_started: False when the signal came before any worker started (nothing trained).
    """

    def __init__(self, signum: int, workers_started: bool = True) -> None:
        self.signum = signal.Signals(signum)
        self.workers_started = workers_started
        super().__init__(f"stopped by {self.signum.name}")


def interrupt_job_on_stop_signals() -> None:
    """Until torch's agent installs its own handlers (as it starts the workers): each of
    :data:`~ddp_engine.core.lifetime.STOP_SIGNALS` raises :class:`JobInterrupted` in this process, as
    the agent's does once the workers run (:func:`launch`), so that a stop between the run
    directory's creation and the workers' start is recorded as the run's stop, not a traceback. A
    signal this process ignores (``SIG_IGN``) stays ignored."""

    def interrupt(signum: int, frame: object) -> None:
        raise JobInterrupted(signum, workers_started=False)

    on_stop_signals(interrupt)


def check_rendezvous_address(environ: os._Environ | dict = os.environ) -> None:
    """Refuse a ``MASTER_ADDR`` that does not resolve or a ``MASTER_PORT`` already in use, before
    any process starts (single-node runs started by this template only; under torchrun or SLURM the
    launcher owns them).

    Without ``MASTER_PORT`` the operating system picks a free port for the rendezvous (port 0), so
    two runs started at once never collide.

    Raises:
        ConfigValueError: naming the variable, its value and the fix.
    """
    address, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if address:
        try:
            family, _, _, _, socket_address = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)[0]
        except socket.gaierror as error:
            raise ConfigValueError(
                f"MASTER_ADDR={address} does not resolve ({error.strerror}): unset it (a run on one machine "
                "needs none) or set it to this machine's address."
            ) from None
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:  # the rendezvous store listens there: it must be an address of this machine
                probe.bind((socket_address[0], 0))
            except OSError:
                raise ConfigValueError(
                    f"MASTER_ADDR={address} is not an address of this machine, where the run's rendezvous "
                    "listens: unset it (a run on one machine needs none), or use torchrun or SLURM to run on "
                    "several machines."
                ) from None
    if not port:
        return
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigValueError(f"MASTER_PORT={port} is not a port number (1..65535): unset it, or choose another.")
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # As the rendezvous store binds: reusing a port in TIME_WAIT, never one something listens on.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("", int(port)))
    except OSError as error:
        reason = "something else is listening there" if error.errno == errno.EADDRINUSE else error.strerror
        raise ConfigValueError(
            f"MASTER_PORT={port} is busy ({reason}): unset MASTER_PORT so that a free port is picked, "
            "or choose another."
        ) from None
    finally:
        probe.close()


#: Seconds a command waits for a run directory's lock before it refuses the directory as in use.
LOCK_PATIENCE = 0.5
#: The run directories this process holds for the rest of its life (:func:`hold_run_dir`), each
#: with its open ``.lock`` file (closing it would let the lock go).
_held_run_dirs: dict[Path, TextIO] = {}


@contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for this job: a second command started into the same directory meanwhile
    (the check for an earlier run cannot see a run that has not written anything yet) is refused.
    An advisory lock (``flock``) on ``run_dir/.lock``, which the kernel releases when this process
    ends, however it ends. A directory this process already holds (:func:`hold_run_dir`) stays held.

    Raises:
        ConfigValueError: when another process holds the directory.
    """
    if run_dir.resolve() in _held_run_dirs:
        yield
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "a+") as lock:
        _take_run_dir_lock(run_dir, lock)
        yield


def hold_run_dir(run_dir: Path) -> None:
    """Take ``run_dir``'s lock (:func:`run_dir_lock`) now, for the rest of this process's life:
    for a single run into a directory named on the command line (``hydra.run.dir=``), once its
    command line is checked and before Hydra writes its config there. Two commands started into
    the same directory at once both passed :func:`check_run_dir_free`, and the one refused later,
    by the lock, had rewritten the other's ``.hydra/config.yaml`` and ``overrides.yaml`` (what a
    resume reads) on its way.

    Raises:
        ConfigValueError: when another process holds the directory.
    """
    if run_dir.resolve() in _held_run_dirs:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = open(run_dir / ".lock", "a+")  # noqa: SIM115 -- open for the process's life: it holds the lock
    try:
        _take_run_dir_lock(run_dir, lock)
    except ConfigValueError:
        lock.close()
        raise
    _held_run_dirs[run_dir.resolve()] = lock


def check_run_dir_free(run_dir: Path) -> None:
    """Refuse a command into ``run_dir`` while another command holds it (:func:`run_dir_lock`),
    before anything is written: the check before launch, which writes nothing (it takes the lock
    and lets it go at once). :func:`run_dir_lock` stays the guard for two commands that start at once.

    Raises:
        ConfigValueError: when another process holds the directory.
    """
    if run_dir.resolve() in _held_run_dirs:  # this process's own (:func:`hold_run_dir`)
        return
    try:
        lock = open(run_dir / ".lock")  # noqa: SIM115 -- closed below; no lock file: nobody holds it
    except FileNotFoundError:
        return
    with lock:
        _take_run_dir_lock(run_dir, lock)


def _take_run_dir_lock(run_dir: Path, lock) -> None:
    """``flock`` ``lock`` (the open ``run_dir/.lock``), waiting at most :data:`LOCK_PATIENCE`
    seconds: another command's :func:`check_run_dir_free` takes it for an instant.

    Raises:
        ConfigValueError: naming the holder's pid (the file's content) when another process holds it.
    """
    deadline = time.monotonic() + LOCK_PATIENCE
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                lock.seek(0)
                raise ConfigValueError(
                    f"{run_dir} is in use by another run (pid {lock.read().strip() or '?'}): start this one in "
                    "another directory, or wait for that one to end."
                ) from None
            time.sleep(0.05)
    if lock.writable():  # the holder's pid, for the message above
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()


def write_job_file(run_dir: Path, task: str, cfg: DictConfig, logging_config: DictConfig) -> Path:
    """Write what the workers run into ``run_dir/.hydra/job.yaml``: the task's import path
    (``module:function``), the job's config and Hydra's logging config.

    A worker has no Hydra runtime, so every ``${hydra:...}`` interpolation (the run directory, in
    ``paths``) is resolved here; the config's other interpolations stay, so that the worker still
    follows changes made before it builds the objects (the scaled learning rate that the
    scheduler's ``max_lr: ${model.optimizer.lr}`` reads).

    Returns:
        The file's path.
    """
    path = run_dir / JOB_FILE
    job = OmegaConf.create(
        {
            "task": task,
            "config": resolve_hydra_interpolations(cfg),
            "logging": OmegaConf.to_container(logging_config, resolve=True),
        }
    )
    write_atomically(path, OmegaConf.to_yaml(job))
    return path


def resolve_hydra_interpolations(cfg: DictConfig) -> dict:
    """``cfg`` as plain containers, with each value that interpolates ``${hydra:...}`` resolved and
    every other interpolation kept as written."""

    def resolve(node: DictConfig | ListConfig, written: dict | list) -> dict | list:
        """``written`` (``node`` as plain containers, unresolved) with its ``${hydra:...}`` values resolved."""
        for key in written.keys() if isinstance(written, dict) else range(len(written)):
            if OmegaConf.is_interpolation(node, key):
                if "hydra:" in written[key]:
                    written[key] = node[key]
            elif isinstance(written[key], dict | list):
                resolve(node[key], written[key])
            elif isinstance(written[key], Enum):
                written[key] = written[key].value
        return written

    return resolve(cfg, OmegaConf.to_container(cfg, resolve=False))


def preload_workers(task_module: str) -> None:
    """Start the forkserver that the job's workers are forked from, importing ``task_module`` (the
    job's task: ``ddp_engine.run.train``, with torch and Lightning) after
    :mod:`ddp_engine.launch.forkserver_preload`; it returns at once
    (:func:`~ddp_engine.core.compat.start_forkserver`). The command calls it right
    after the key check, so that the imports overlap its value checks; :func:`launch` calls it
    again (nothing happens when the forkserver runs). The forkserver ends with this process.

    A forkserver's environment is this process's now: the workers take this process's environment
    when they are launched (:func:`ddp_engine.launch.worker.run`).
    """
    import multiprocessing

    from ddp_engine.core.compat import start_forkserver, start_resource_tracker_with_sighup_blocked

    # Python's resource tracker (started with the forkserver, for its semaphores) ignores SIGINT and
    # SIGTERM but not SIGHUP: a closed terminal killed it with the command's process group, and
    # each worker's exit then printed a KeyError traceback from the tracker started anew. Started
    # here with SIGHUP blocked, which it keeps; this process gets a SIGHUP sent meanwhile at once after.
    start_resource_tracker_with_sighup_blocked()
    os.environ[SUPERVISOR_ENV] = str(os.getpid())
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["ddp_engine.launch.forkserver_preload", task_module])
    start_forkserver(context)  # in this thread, which the forkserver ends with: the main one


class ForkserverUnavailable(RuntimeError):
    """The job's forkserver is not running: it could not start (its Python could not be executed)."""


def run_in_forkserver(function: str, *args: object) -> Any:
    """``function(*args)`` (``module:function``) in a process forked from the job's forkserver
    (:func:`preload_workers`, called first), which imports torch, Lightning and the task for the
    workers: its value returned here, and an exception it raises (a refusal) raised here. The
    process takes this one's environment, and ends with the forkserver, which ends with this one.

    Raises:
        ForkserverUnavailable: the forkserver is not running (its interpreter could not be executed),
            or it ended before it forked the process.
        RuntimeError: the process ended without an answer (its exit code said), or ``function``
            raised an exception that cannot be sent back (its traceback said).
    """
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_answer, args=(function, args, dict(os.environ), os.getpid(), send))
    try:
        process.start()
    except OSError as error:  # nothing listens on the forkserver's socket
        receive.close()
        raise ForkserverUnavailable(f"The job's forkserver is not running ({error}).") from None
    except EOFError:  # it took the request, then closed it unanswered: it ended meanwhile
        receive.close()
        raise ForkserverUnavailable("The job's forkserver ended before it forked the process.") from None
    finally:
        send.close()  # the child's copy is its own: recv() ends with EOFError once the child has gone
    try:
        failed, value = receive.recv()
    except EOFError:
        process.join()
        raise RuntimeError(
            f"{function} ended without an answer (exit code {process.exitcode}) in a process forked from the "
            "job's forkserver."
        ) from None
    finally:
        receive.close()
    process.join()
    if failed:
        raise value
    return value


def _answer(function: str, args: tuple, environ: dict[str, str], supervisor: int, send: Connection) -> None:
    """What :func:`run_in_forkserver`'s process runs: ``function(*args)`` in the supervisor's
    environment, sending back ``(False, value)`` or ``(True, the exception)``."""
    from setproctitle import setproctitle

    from ddp_engine.launch import forkserver_preload

    end_with_parent(forkserver_preload.FORKSERVER_PID, "forkserver")
    setproctitle(f"ddp_engine {function} for pid {supervisor}")
    os.environ.clear()
    os.environ.update(environ)
    try:
        answer = (False, imported(function)(*args))
    except Exception as error:
        answer = (True, error)
    try:
        send.send(answer)
    except Exception:  # an exception or a value that does not pickle: its traceback, as text
        send.send((True, RuntimeError(f"{function} in a process forked from the job's forkserver:\n{format_exc()}")))


def launch(
    job_file: Path, task_module: str, nproc_per_node: int, rendezvous_timeout: float, shutdown_timeout: float
) -> None:
    """Run :func:`ddp_engine.launch.worker.run` of ``job_file`` in ``nproc_per_node`` processes on this
    machine, forked from the forkserver that imported ``task_module`` (:func:`preload_workers`), under
    torch's elastic agent, and wait for all of them.

    Args:
        job_file: from :func:`write_job_file`.
        nproc_per_node: the number of worker processes (``trainer.devices``).
        rendezvous_timeout: seconds the agent's rendezvous may take (``launcher.rendezvous_timeout``).
        shutdown_timeout: seconds a worker has to end after SIGTERM before the agent SIGKILLs it
            (``launcher.shutdown_timeout``).

    Raises:
        JobFailedError: a worker failed; every worker has ended.
        JobInterrupted: this process got SIGINT or SIGTERM; every worker has ended.
    """
    # Imported here: torch's elastic launcher is only needed where a job starts its processes.
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from ddp_engine.core.compat import name_rendezvous_events_by_frame
    from ddp_engine.launch.worker import run

    name_rendezvous_events_by_frame()  # 0.3 to 0.6 s less before the workers start: see there
    preload_workers(task_module)
    address, port = os.environ.get("MASTER_ADDR") or "localhost", os.environ.get("MASTER_PORT") or "0"
    with tempfile.TemporaryDirectory(prefix="ddp-engine-errors-") as error_dir:
        config = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=nproc_per_node,
            run_id=uuid.uuid4().hex,
            # torchrun --standalone's rendezvous: the agent's TCP store on a port the OS picks (0).
            rdzv_backend="c10d",
            rdzv_endpoint=f"{address}:{port}",
            rdzv_configs={"timeout": int(rendezvous_timeout)},
            max_restarts=0,
            monitor_interval=0.1,
            start_method="forkserver",
            shutdown_timeout=int(shutdown_timeout),
            # error.json of each worker (torch's ErrorHandler, written by ddp_engine.launch.worker); no redirects.
            logs_specs=DefaultLogsSpecs(log_dir=error_dir),
        )
        try:
            elastic_launch(config, run)(str(job_file), dict(os.environ))
        except ChildFailedError as failed:
            rank, failure = root_failure(failed.failures)
            raise JobFailedError(rank, failure.exitcode, describe_failure(failure)) from None
        except SignalException as stopped:
            raise JobInterrupted(stopped.sigval) from None


def collect_stacks(run_dir: Path, failure: JobFailedError) -> list[Path]:
    """After a failed job: when its first failure is a timeout (a collective, the store), keep each
    stopped worker's stacks as ``hang-rank<r>.txt`` in the run directory and return those files;
    otherwise (the stacks show only where a healthy worker was stopped) remove them.

    The worker that timed out writes its own ``hang-rank<r>.txt`` (see :mod:`ddp_engine.launch.worker`);
    the others, the rank that never reached the collective among them, wrote theirs when the
    agent stopped them.
    """
    stacks = run_dir / STACKS_DIR
    if TIMEOUT_PATTERN.search(failure.error) and stacks.is_dir():
        for path in stacks.glob("rank*.txt"):
            target = run_dir / f"hang-{path.name}"
            if path.stat().st_size and not target.exists():  # the timed-out worker's own file wins
                header = (
                    f"{path.stem.replace('rank', 'Rank ')}: every thread's Python stack when the supervisor stopped "
                    f"it, after rank {failure.rank}'s {failure.error}\n\n"
                )
                target.write_text(header + path.read_text())
    remove_stacks(run_dir)
    if not TIMEOUT_PATTERN.search(failure.error):
        return []
    return sorted(run_dir.glob("hang-rank*.txt"), key=lambda path: int(path.stem.removeprefix("hang-rank")))


def remove_stacks(run_dir: Path) -> None:
    """Remove the stacks the workers wrote when they were stopped (kept only for a hang: :func:`collect_stacks`)."""
    shutil.rmtree(run_dir / STACKS_DIR, ignore_errors=True)
