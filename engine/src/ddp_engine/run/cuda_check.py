"""How a DDP worker asks torch whether CUDA is there: once through the CUDA runtime, not every time
through NVML.

Importing Lightning sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` in the process's environment, so that
``torch.cuda.is_available()`` does not initialize CUDA in a process that forks CUDA workers later
(pytorch/pytorch#83973). torch answers such a check through NVML and caches the answer only once
CUDA is initialized, which on a machine without a GPU never happens: every check then loads
``libnvidia-ml`` again and fails. torch's optimizers check at every ``step()`` (the CUDA-graph
capture check), so on CPU every optimizer step pays for that failed load (the template's
benchmarks measure the cost). A worker forks no CUDA process (its DataLoader workers use no CUDA), so it
asks the runtime, whose answer torch caches.
"""

import os

#: The variable Lightning sets (lightning/fabric/__init__.py); read by torch.cuda.is_available().
NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"


def check_cuda_through_runtime() -> None:
    """Make this process's CUDA availability checks go through the CUDA runtime (cached after the
    first) instead of NVML (repeated on a machine without a GPU). Call it in a worker after
    Lightning is imported; it changes only this process's environment and what it starts later."""
    os.environ.pop(NVML_CHECK_ENV, None)
