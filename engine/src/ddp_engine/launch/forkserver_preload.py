"""Imported first in the job's forkserver, the process that every worker is forked from.

The supervisor starts the forkserver (:func:`ddp_engine.launch.supervisor.preload_workers`) as soon
as the command's keys are checked. It imports this module and then the job's task module (torch,
Lightning, torchmetrics, the model and the data: seconds), while the supervisor checks the values;
torch's elastic agent then forks each worker from it (``start_method="forkserver"``), so that no
worker imports them again. Python's ``multiprocessing`` runs the forkserver; this module only makes
it end with the supervisor and records what a worker needs to tell its environment apart:

- the kernel sends the forkserver SIGTERM when the supervisor dies, however it dies (a refused
  command exits while the forkserver may still be importing);
- Ctrl-C (SIGINT to the terminal's whole process group) ends it quietly while it imports: the
  supervisor answers the Ctrl-C, and a traceback from inside an import would only confuse. A
  supervisor that ignores SIGINT (``command &`` in a script) started it ignoring SIGINT too, and so
  it stays: ended, it was started again by the launch, which went on as if nothing happened;
- a closed terminal's SIGHUP is ignored: the supervisor passes it on to the workers;
- its command line in ``ps`` names the supervisor's, so that a leftover one would be found with it.
"""

import os
import signal
from pathlib import Path

from setproctitle import setproctitle

from ddp_engine.core.lifetime import SUPERVISOR_ENV, end_with_parent

#: The forkserver's pid: each worker forked from it ends with it (:func:`ddp_engine.launch.worker.run`).
FORKSERVER_PID = os.getpid()
#: This process's environment before the job's modules are imported. A worker forked from it
#: takes the supervisor's environment at launch, plus what differs from this: the variables the
#: agent sets for its rank (``RANK``, ``MASTER_PORT``, ...) and those the imports set.
ENVIRON = dict(os.environ)

# In the forkserver only: not in the supervisor, nor where a tool imports every module (tests/core).
if os.environ.get(SUPERVISOR_ENV, str(os.getpid())) != str(os.getpid()):
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, lambda signum, frame: os._exit(128 + signum))
    # A closed terminal's SIGHUP is the supervisor's to answer (it passes it on to the workers):
    # ended by it, the forkserver ended its workers with SIGTERM before the agent's SIGHUP reached
    # them, and the run said it was stopped by SIGTERM. It ends with the supervisor in any case.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _supervisor = int(os.environ[SUPERVISOR_ENV])
    end_with_parent(_supervisor, "supervisor")
    try:
        _command = Path(f"/proc/{_supervisor}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # not Linux's /proc: the title is only for ps
        _command = ""
    setproctitle(f"ddp_engine forkserver of pid {_supervisor}: {_command.strip()}")
