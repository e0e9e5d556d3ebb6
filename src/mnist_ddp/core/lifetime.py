"""A child process that ends with its parent, however the parent dies: Linux's ``PR_SET_PDEATHSIG``.

A worker ends with its supervisor (:mod:`mnist_ddp.launch.worker`), a job of a parallel sweep with
the sweep's command (:mod:`mnist_ddp.launch.parallel_jobs`): even a SIGKILLed parent leaves no orphan.
"""

import ctypes
import logging
import os
import signal
import sys

log = logging.getLogger(__name__)

#: ``prctl`` option: the signal this process gets when its parent dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1


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
