"""Imported first by the forkserver that a process's DataLoader workers are forked from
(:func:`ddp_engine.data.loader_workers.workers_context`), and by nothing else: it ties the
forkserver's life and its workers' to the process that started it.

- The kernel sends the forkserver SIGTERM when that process ends, however it ends (SIGKILL too),
  and each worker SIGTERM when the forkserver ends (Linux ``PR_SET_PDEATHSIG``, set in each worker
  right after its fork). Without it, Python's forkserver ends only once no process holds its
  connection, and each worker holds one, while a worker ends only once its parent, the
  forkserver, has (torch checks every 5 s): the two would wait on each other and outlive their
  process, holding the command's output open.
- SIGINT and SIGHUP (Ctrl-C, a closed terminal: sent to the whole process group) are ignored, by
  the forkserver and by the workers it forks (they keep the forkserver's dispositions): the
  process they serve stops on them at its next batch, which its workers still load, and they end
  with it.
- Its title in ``ps`` names the process it serves, and so does each worker's.
"""

import ctypes
import os
import signal

from setproctitle import setproctitle

from ddp_engine.core.lifetime import PR_SET_PDEATHSIG, end_with_parent
from ddp_engine.data.loader_workers import LOADER_FORKSERVER_PARENT_ENV

#: The forkserver's pid; each worker ends with it.
FORKSERVER_PID = os.getpid()
#: The pid of the process whose workers this forkserver starts (its parent).
SERVED_PID = os.getppid()


def end_with_forkserver() -> None:
    """In a worker, right after the forkserver forked it: have the kernel send it SIGTERM when the
    forkserver ends, and end now if it already has (``os._exit``: an exception raised in an at-fork
    handler is only printed)."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != FORKSERVER_PID:
        os._exit(128 + signal.SIGTERM)
    setproctitle(f"ddp_engine DataLoader worker of pid {SERVED_PID}")


# In the forkserver of the process that set the variable only: not in a worker (its parent is the
# forkserver), nor where a tool imports every module (tests/core), nor when that process has
# already ended (then the forkserver's parent is another: it ends by itself, as no process holds
# its connection any longer).
if os.environ.get(LOADER_FORKSERVER_PARENT_ENV) == str(SERVED_PID):
    for _signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(_signum, signal.SIG_IGN)
    end_with_parent(SERVED_PID, "process")
    setproctitle(f"ddp_engine DataLoader forkserver of pid {SERVED_PID}")
    os.register_at_fork(after_in_child=end_with_forkserver)
