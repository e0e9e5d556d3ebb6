"""How the template's processes end.

A child process ends with its parent, however the parent dies (Linux's ``PR_SET_PDEATHSIG``): a
worker ends with the forkserver it was forked from and the forkserver with its supervisor
(:mod:`ddp_engine.launch.forkserver_preload`), a job of a parallel sweep with the sweep's command
(:mod:`ddp_engine.launch.parallel_jobs`): even a SIGKILLed parent leaves no orphan.

A command's own process ends without the interpreter's teardown (:func:`exit_without_teardown`),
and a stop signal ends it at once while it starts (:func:`end_at_once_on_stop_signals`).
"""

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from ddp_engine.core.compat import run_exit_handlers

log = logging.getLogger(__name__)

#: Set by the supervisor (:mod:`ddp_engine.launch.supervisor`) to its pid for the forkserver of its
#: workers, which ends with it (:mod:`ddp_engine.launch.forkserver_preload`): its parent's pid, read
#: before the request to end with it, could already be a reaper's.
SUPERVISOR_ENV = "DDP_ENGINE_SUPERVISOR_PID"
#: ``prctl`` option: the signal this process gets when its parent dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1
#: The signals a run stops on: Ctrl-C, kill / a scheduler, a closed terminal or ssh session.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: The handlers that :func:`end_at_once_on_stop_signals` replaced, for :func:`restore_stop_signals`.
_replaced_handlers: dict[int, object] = {}


def end_with_parent(parent_pid: int, parent: str) -> None:
    """Have the kernel send this process SIGTERM when its parent (pid ``parent_pid``, named
    ``parent`` in the warning) dies.

    Raises:
        SystemExit: 128 + SIGTERM if the parent is already gone (it died before the request took effect).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        log.warning(f"prctl(PR_SET_PDEATHSIG) failed (errno {errno}): this process may outlive its {parent}")
    if os.getppid() != parent_pid:
        sys.exit(128 + signal.SIGTERM)


def end_at_once_on_stop_signals(when: str) -> None:
    """Until a later handler replaces them: each of :data:`STOP_SIGNALS` ends this process at once,
    with status 128 + the signal and one line on stderr, ``Stopped by SIGINT <when>.``; a signal
    this process was started with ignored (``SIG_IGN``: ``command &`` in a script ignores SIGINT,
    ``nohup`` SIGHUP) stays ignored, as Python leaves it.

    For a command's start, while it checks its values and before its workers run (from then on
    the job's own handlers stop it: :func:`ddp_engine.launch.supervisor.launch`, torch's agent,
    Lightning's), when there is nothing to save: Python's ``KeyboardInterrupt`` came out as a
    traceback from whichever import or library it hit (a ``RecursionError`` from inside numpy's
    import, once, on Ctrl-C), and a library that catches every exception could swallow it.
    """

    def end(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):  # os.write: no buffer to lock, as a signal handler wants
            os.write(2, f"Stopped by {signal.Signals(signum).name} {when}.\n".encode())
        os._exit(128 + signum)

    for signum, replaced in on_stop_signals(end).items():
        _replaced_handlers.setdefault(signum, replaced)


def on_stop_signals(handler: Callable[[int, object], None]) -> dict[int, object]:
    """Install ``handler`` for each of :data:`STOP_SIGNALS` that this process does not ignore (one
    it was started with ignored, ``SIG_IGN``, stays so, as Python leaves it); returns the handlers
    it replaced, by signal."""
    return {
        signum: signal.signal(signum, handler)
        for signum in STOP_SIGNALS
        if signal.getsignal(signum) is not signal.SIG_IGN
    }


def restore_stop_signals() -> None:
    """Give the stop signals back the handlers that :func:`end_at_once_on_stop_signals` replaced
    (Python's: ``KeyboardInterrupt`` on SIGINT), for work in this process that cleans up on its way
    out (an export's partial file)."""
    while _replaced_handlers:
        signum, handler = _replaced_handlers.popitem()
        signal.signal(signum, handler)


def stop_with_process(pid: int, name: str, every_s: float = 0.5) -> threading.Thread:
    """Send this process SIGTERM (the template's stop: :class:`ddp_engine.callbacks.signals.StopOnSignal`)
    once the process ``pid`` (named ``name`` in the log) has ended, checked every ``every_s``
    seconds by a daemon thread, which it returns.

    For a process that is not ``pid``'s child, where ``PR_SET_PDEATHSIG`` cannot help: a task of
    submitit's local executor (``hydra/launcher=slurm_local``) is the child of submitit's controller,
    not of the sweep's command, and would otherwise train on as an orphan once that command is killed.
    """

    def watch() -> None:
        while os.path.exists(f"/proc/{pid}") and not _is_zombie(pid):
            threading.Event().wait(every_s)
        log.warning(f"The {name} (pid {pid}) has ended: stopping this process")
        os.kill(os.getpid(), signal.SIGTERM)

    watcher = threading.Thread(target=watch, name=f"stop-with-{pid}", daemon=True)
    watcher.start()
    return watcher


def _is_zombie(pid: int) -> bool:
    """Whether ``pid`` has ended but its parent has not reaped it yet (state Z in ``/proc/<pid>/stat``)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def exit_without_teardown(command: Callable[[], object]) -> None:
    """Run ``command``, then end the process as a normal exit does, without the teardown of the
    interpreter's objects: wait for its non-daemon threads, run its ``atexit`` handlers (logging's
    flush, multiprocessing's finalizers, a tracker's last upload), flush stdout and stderr, and
    ``os._exit`` with the status ``sys.exit`` would give (0 on return, ``SystemExit``'s code).

    Why: once torch, Lightning and torchmetrics are imported, CPython's finalization (freeing every
    module's objects, one by one) takes 1.3 s on a 2-core machine, and the command's answer (its
    last line, a refusal) is already out: the user waits for nothing. The workers that
    ``multiprocessing`` starts already end this way (``os._exit``). An exception other than
    ``SystemExit`` (a bug) propagates, with its traceback, through the normal exit; so does the
    end of a command run under a profiler or a debugger (``python -m cProfile``, ``pdb``), which
    writes its results once the program returns; and so does every command on a Python that has no
    call to run the exit handlers before ``os._exit`` (:func:`~ddp_engine.core.compat.run_exit_handlers`,
    said once).
    """
    if sys.getprofile() is not None or sys.gettrace() is not None:
        command()
        return
    try:
        command()
        status = 0
    except SystemExit as exit_:
        status = exit_.code
    for thread in threading.enumerate():  # as the interpreter's exit: non-daemon threads end first
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    if status is not None and not isinstance(status, int):  # sys.exit("message"): printed, status 1
        print(status, file=sys.stderr)
        status = 1
    if not run_exit_handlers():
        sys.exit(status)  # the normal exit runs them
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # none, a closed pipe, a closed file
            stream.flush()
    os._exit(status or 0)
