"""Host memory: keep the memory a training step frees for the next step, instead of handing it
back to the operating system and faulting it in again.

glibc's ``malloc`` gives freed memory at the top of its heap back to the OS once more than its
trim threshold is free, and serves blocks from 128 KiB up with fresh ``mmap`` calls; it raises
both thresholds as a process frees large blocks. So what a process happened to free early on
(a data set copy, a figure) decides whether the activations of every later step, a few MiB each
on CPU, come from memory it keeps or from new pages. A DDP process that faults its activations
in afresh every step spends that time in the kernel, and its replicas, waiting for it in every
AllReduce, slow down with it. Fixing both thresholds as below keeps the freed memory for the next
step (the page faults with and without: the template's benchmarks measure them).
"""

import ctypes
import logging

log = logging.getLogger(__name__)

# mallopt() parameters, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


def keep_freed_host_memory(trim_threshold_mib: int = 256, mmap_threshold_mib: int = 32) -> bool:
    """Fix glibc's malloc thresholds for this process (its dynamic adjustment is then off).

    Args:
        trim_threshold_mib: free memory at the top of the heap kept for reuse before any is given
            back to the OS (MiB, default 256).
        mmap_threshold_mib: blocks of this size and larger get their own ``mmap`` and are unmapped
            when freed; smaller ones come from the heap (MiB, default 32: glibc's maximum on
            64-bit systems). Data sets loaded as one tensor are larger and stay mapped.

    Returns:
        True when both were set; False where the C library has no ``mallopt`` (macOS, Windows,
        musl) or refused a value, and nothing changed.
    """
    try:
        # The symbols already loaded into this process, the C library's among them; unlike
        # ctypes.util.find_library, this starts no ldconfig subprocess in every DDP process.
        libc = ctypes.CDLL(None)
    except (OSError, TypeError):  # Windows has no such handle
        return False
    if not hasattr(libc, "mallopt"):
        return False
    applied = libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold_mib * 2**20) == 1
    applied = applied and libc.mallopt(M_TRIM_THRESHOLD, trim_threshold_mib * 2**20) == 1
    if not applied:
        log.warning("mallopt refused the malloc thresholds; host memory keeps glibc's defaults")
    return applied
