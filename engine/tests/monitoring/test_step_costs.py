"""What the engine does at every optimizer step is kept cheap:
the progress bar's work only when it redraws, the last-checkpoint callback's key formatted once,
the CUDA check of torch's optimizers answered by the runtime instead of NVML."""

import os
from datetime import timedelta
from types import SimpleNamespace

import lightning  # noqa: F401 -- sets PYTORCH_NVML_BASED_CUDA_CHECK, which the CUDA test is about
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar

from ddp_engine.callbacks import progress_bar
from ddp_engine.callbacks.progress_bar import ThrottledRichProgressBar
from ddp_engine.core.errors import ConfigValueError
from ddp_engine.distributed.checkpoint_io import LastCheckpoint
from ddp_engine.run.cuda_check import NVML_CHECK_ENV, check_cuda_through_runtime


def test_the_training_bar_is_updated_only_when_it_redraws_and_at_the_epochs_last_batch(monkeypatch):
    updated, now = [], [0.0]
    monkeypatch.setattr(RichProgressBar, "on_train_batch_end", lambda self, *args: updated.append(args[-1]))
    monkeypatch.setattr(progress_bar.time, "monotonic", lambda: now[0])
    bar = ThrottledRichProgressBar(refresh_rate=2)  # a redraw every 0.5 s
    bar._trainer = SimpleNamespace(num_training_batches=8, max_epochs=1, max_steps=-1)
    bar.train_progress_bar_id = 0
    for batch_idx, seconds in enumerate([0.0, 0.1, 0.3, 0.55, 0.6, 0.8, 0.9, 1.0]):
        now[0] = seconds
        bar.on_train_batch_end(None, None, None, None, batch_idx)
    # The first batch; the first 0.5 s after it; the epoch's last (0.45 s after the one before),
    # whose count the bar must end on.
    assert updated == [0, 3, 7]

    bar.disable()  # a rank other than 0, as Lightning disables it: no update at all
    bar.on_train_batch_end(None, None, None, None, 7)
    assert updated == [0, 3, 7]


def test_the_last_checkpoint_key_is_lightnings_formatted_once(tmp_path, monkeypatch):
    callback = LastCheckpoint(str(tmp_path), None, timedelta(minutes=30), 50)
    formatted = []
    generate = callback._generate_state_key
    monkeypatch.setattr(callback, "_generate_state_key", lambda **kwargs: formatted.append(1) or generate(**kwargs))
    keys = {callback.state_key for _ in range(6)}
    # The key Lightning's ModelCheckpoint formats (what checkpoints store the callback's state under).
    assert keys == {ModelCheckpoint.state_key.fget(callback)}
    assert next(iter(keys)).startswith("LastCheckpoint{") and "'every_n_epochs': 1" in next(iter(keys))
    assert len(formatted) == 2, "once for the six reads, once for the comparison above"


@pytest.mark.skipif(torch.cuda.is_initialized(), reason="CUDA initialized in this process: torch caches the count")
def test_a_worker_checks_cuda_through_the_runtime_not_nvml(monkeypatch):
    nvml = []
    count = torch.cuda._device_count_nvml
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: nvml.append(1) or count())
    monkeypatch.setenv(NVML_CHECK_ENV, "1")  # as importing Lightning left it; restored after the test
    torch.cuda.is_available()
    torch.cuda.is_available()
    assert len(nvml) == 2, "with Lightning's variable every check goes through NVML again"
    check_cuda_through_runtime()
    assert NVML_CHECK_ENV not in os.environ
    torch.cuda.is_available()
    torch.cuda.is_available()
    assert len(nvml) == 2
    # torch's optimizers make this check at every step (the CUDA graph capture check).
    parameter = torch.nn.Parameter(torch.ones(3))
    parameter.grad = torch.ones(3)
    torch.optim.Adam([parameter]).step()
    assert len(nvml) == 2


@pytest.mark.parametrize("refresh_rate", [-1, 0.5])
def test_a_refresh_rate_that_is_not_a_whole_number_of_redraws_is_refused(refresh_rate):
    with pytest.raises(ConfigValueError, match=rf"callbacks.progress_bar.refresh_rate={refresh_rate}: .* 0 to hide"):
        ThrottledRichProgressBar(refresh_rate=refresh_rate)
