"""The memory figures of a known model equal its tensor sizes exactly: a Linear
layer of IN x OUT float32 weights and OUT biases, trained with SGD with momentum (one momentum
buffer per parameter) in a real 1-process gloo DDP group, in a real ``Trainer.fit`` with the
template's strategy and memory callback; the GPU arithmetic on a simulated GPU (no GPU here)."""

import json
import os
import socket
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import torch.distributed as dist
from harness import read_scalars
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from ddp_engine.callbacks import memory
from ddp_engine.callbacks.memory import MemoryFootprint, host_resident_bytes
from ddp_engine.distributed.footprint import TensorFootprint, storage_bytes, tensor_footprint
from ddp_engine.distributed.strategy import CommHookDDPStrategy

IN, OUT = 300, 70
#: float32 weights and biases of the Linear layer: 84,280 bytes.
LINEAR_BYTES = (IN * OUT + OUT) * 4
STEPS = 3


@pytest.fixture(scope="module")
def process_group():
    """A 1-process gloo group on a free port; destroyed after the module."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def one_step(ddp: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    ddp(torch.randn(8, IN)).square().sum().backward()
    optimizer.step()


@pytest.mark.parametrize("bucket_view", [False, True], ids=["buckets_apart", "gradients_in_buckets"])
def test_a_linear_layer_with_sgd_momentum_counts_exactly_its_tensor_sizes(process_group, bucket_view):
    layer = nn.Linear(IN, OUT)
    ddp = DistributedDataParallel(layer, gradient_as_bucket_view=bucket_view)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9)
    assert tensor_footprint(layer, [optimizer], ddp) == TensorFootprint(
        LINEAR_BYTES, 0, 0 if bucket_view else LINEAR_BYTES, 0
    )
    one_step(ddp, optimizer)
    # One momentum buffer per parameter. With gradient_as_bucket_view the gradients are views into
    # the one bucket: its storage, counted once, as the gradients.
    expected = TensorFootprint(LINEAR_BYTES, LINEAR_BYTES, 0 if bucket_view else LINEAR_BYTES, LINEAR_BYTES)
    assert tensor_footprint(layer, [optimizer], ddp) == expected
    assert expected.total == (3 if bucket_view else 4) * LINEAR_BYTES


def test_zero_on_one_process_holds_the_whole_state_and_adam_two_buffers_and_a_step_count(process_group):
    layer = nn.Linear(IN, OUT)
    ddp = DistributedDataParallel(layer)
    optimizer = ZeroRedundancyOptimizer(layer.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    one_step(ddp, optimizer)
    # exp_avg and exp_avg_sq per parameter, plus each parameter's float32 step count (4 bytes).
    assert tensor_footprint(layer, [optimizer], ddp).optimizer_state == 2 * LINEAR_BYTES + 2 * 4


def test_a_storage_shared_by_views_counts_once():
    base = torch.zeros(1000)
    assert storage_bytes([base, base[:10], base.view(10, 100), torch.zeros(3, dtype=torch.float64)]) == 4000 + 24


class Linear(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(IN, OUT)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).square().mean()
        self.log("train/loss", loss)  # Lightning's own step for a step's point, to compare with
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def test_the_callback_logs_and_merges_the_exact_figures_of_a_fit(process_group, tmp_path):
    report = tmp_path / "ddp.json"
    report.write_text(json.dumps({"backend": "gloo"}))  # written before by the DDP settings report
    trainer = L.Trainer(
        accelerator="cpu", devices=1, strategy=CommHookDDPStrategy(), max_steps=STEPS, log_every_n_steps=1,
        callbacks=[MemoryFootprint(str(report))], logger=TensorBoardLogger(tmp_path, name="tb", version=""),
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        use_distributed_sampler=False, default_root_dir=tmp_path,
    )  # fmt: skip
    environ = dict(os.environ)  # Lightning's launcher exports the rendezvous variables into this process
    try:
        trainer.fit(Linear(), DataLoader(TensorDataset(torch.randn(8 * STEPS, IN)), batch_size=8))
    finally:
        os.environ.clear()
        os.environ.update(environ)

    saved = json.loads(report.read_text())
    assert saved["backend"] == "gloo"  # the file's other keys are kept
    tensors = {key: LINEAR_BYTES for key in ("parameters", "gradients", "ddp_buckets", "optimizer_state")}
    (first,) = saved["memory"]["first_step"]["ranks"]
    (peak,) = saved["memory"]["peak"]["ranks"]
    # ddp.json's steps are those of the TensorBoard points below (the steps' indices, as train/loss's).
    assert saved["memory"]["first_step"]["step"] == 0 and saved["memory"]["peak"]["step"] == STEPS - 1
    assert {key: first[key] for key in tensors} == tensors == {key: peak[key] for key in tensors}
    # No GPU: the process's resident memory beside them (now, and its peak), no CUDA figures.
    assert set(first) == set(peak) == {*tensors, "host_rss"}
    # Linux keeps per-thread RSS counters that it folds in lazily: VmRSS and VmHWM are right to a
    # few pages (a later VmHWM was measured 4 KiB below an earlier one), not to the byte.
    assert 0 < first["host_rss"] <= peak["host_rss"] + 2**20
    assert peak["host_rss"] <= host_resident_bytes(peak=True) + 2**20
    scalars = read_scalars(tmp_path / "tb", steps=True)
    steps = [saved["memory"][snapshot]["step"] for snapshot in ("first_step", "peak")]
    for key in tensors:
        assert scalars[f"memory/rank_0/{key}_mib"] == [(step, LINEAR_BYTES / 2**20) for step in steps]
    # At the steps where Lightning logs the first and the last step's train/loss (log_every_n_steps=1).
    losses = [step for step, _ in scalars["train/loss"]]
    assert len(losses) == STEPS and steps == [losses[0], losses[-1]] == [0, STEPS - 1]


class SimulatedGPUModule(nn.Module):
    """The Linear layer, on a 'cuda' device as far as the callback can tell (its tensors stay on the CPU)."""

    device = torch.device("cuda")

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(IN, OUT)

    def all_gather(self, tensor):
        return tensor


def test_on_a_gpu_the_rest_is_cudas_allocated_bytes_less_the_tensors(monkeypatch, tmp_path):
    """CUDA's statistics replaced (no GPU here): 1 MiB allocated after the first step, 3 MiB at the
    peak of epoch 0, 2 MiB in epoch 1 (the throughput monitor reset the peak between); reserved 4 / 8 MiB."""
    allocated, peaks = [2**20], iter([3 * 2**20, 2 * 2**20, 2 * 2**20])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: allocated[0])
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 4 * 2**20)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: next(peaks))
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: 8 * 2**20)
    module = SimulatedGPUModule()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    module.layer(torch.randn(4, IN)).sum().backward()
    optimizer.step()
    logged = []
    logger = SimpleNamespace(log_metrics=lambda metrics, step: logged.append((step, metrics)))
    trainer = SimpleNamespace(global_step=0, world_size=1, is_global_zero=True, loggers=[logger],
                              optimizers=[optimizer],
                              strategy=SimpleNamespace(model=module, root_device=torch.device("cpu")))  # fmt: skip
    callback = MemoryFootprint(str(tmp_path / "ddp.json"))
    callback.on_train_start(trainer, module)
    trainer.global_step = 1
    callback.on_train_batch_end(trainer, module, None, None, 0)
    callback.on_train_epoch_end(trainer, module)
    trainer.global_step = 2
    callback.on_train_epoch_end(trainer, module)
    callback.on_train_end(trainer, module)

    tensors = 3 * LINEAR_BYTES  # parameters, gradients, momentum: no DDP wrapper, so no buckets
    first, peak = (callback.snapshots[name]["ranks"][0] for name in ("first_step", "peak"))
    assert (first["cuda_allocated"], first["cuda_reserved"], first["other"]) == (2**20, 4 * 2**20, 2**20 - tensors)
    assert (peak["cuda_allocated"], peak["cuda_reserved"], peak["other"]) == (3 * 2**20, 8 * 2**20, 3 * 2**20 - tensors)
    assert logged[0] == (0, {f"memory/rank_0/{key}_mib": value / 2**20 for key, value in first.items()})
    assert json.loads((tmp_path / "ddp.json").read_text())[memory.JSON_KEY] == callback.snapshots


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_real_gpu_the_tensors_are_counted_exactly_and_the_rest_is_what_cuda_holds_besides(tmp_path):
    device = torch.device("cuda", torch.cuda.current_device())
    module = SimulatedGPUModule().to(device)
    module.device = device
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    module.layer(torch.randn(4, IN, device=device)).sum().backward()
    optimizer.step()
    trainer = SimpleNamespace(global_step=0, world_size=1, is_global_zero=True, loggers=[], optimizers=[optimizer],
                              strategy=SimpleNamespace(model=module, root_device=device))  # fmt: skip
    callback = MemoryFootprint(str(tmp_path / "ddp.json"))
    callback.on_train_start(trainer, module)
    trainer.global_step = 1
    callback.on_train_batch_end(trainer, module, None, None, 0)
    callback.on_train_end(trainer, module)
    first, peak = (callback.snapshots[name]["ranks"][0] for name in ("first_step", "peak"))
    for snapshot in (first, peak):
        assert {key: snapshot[key] for key in ("parameters", "gradients", "ddp_buckets", "optimizer_state")} == {
            "parameters": LINEAR_BYTES, "gradients": LINEAR_BYTES, "ddp_buckets": 0, "optimizer_state": LINEAR_BYTES
        }  # fmt: skip
    # CUDA's blocks are the tensors' bytes rounded up to 512 and more: what it holds besides is >= 0.
    assert first["other"] == first["cuda_allocated"] - 3 * LINEAR_BYTES >= 0
    assert peak["cuda_allocated"] >= first["cuda_allocated"] and peak["cuda_reserved"] >= peak["cuda_allocated"]
