"""What only a CUDA GPU runs, in this process: the fast GPU recipe (``experiment=fast_gpu``) keeps the
data set on the GPU and trains in bf16 mixed precision there.

Skipped without CUDA (this project's CI machines have none) and marked ``cuda``: `make gpu-check`
(benchmarks/gpu_check.py) runs these with every other CUDA test on a machine with GPUs. NCCL and
SyncBatchNorm need several processes: engine/tests/launch/test_ddp_failures.py::test_sync_batchnorm_and_nccl_on_a_gpu
and the GPU check's own steps run them.
"""

import lightning as L
import pytest
import torch
from ddp_engine.config.schema import register_configs
from ddp_engine.models.build import build_model
from helpers import CONFIG_DIR
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

STEPS = 3


def test_fast_gpu_recipe_keeps_the_data_on_the_gpu_and_trains_in_bf16(synthetic_data_dir, tmp_path):
    register_configs()
    # Not compiled: compiling takes tens of seconds and is the GPU check's fast_gpu step's.
    overrides = [
        "experiment=fast_gpu",
        f"data.data_dir={synthetic_data_dir}",
        "data.val_size=200",
        "model.compile=false",
    ]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    assert cfg.data.on_device and cfg.trainer.accelerator == "gpu" and cfg.trainer.precision == "bf16-mixed"
    L.seed_everything(0)
    datamodule = instantiate(cfg.data)
    model = build_model(cfg.model, datamodule.spec)
    seen = []
    model.net.register_forward_hook(lambda module, inputs, output: seen.append((inputs[0].device.type, output.dtype)))
    initial = [parameter.detach().clone() for parameter in model.parameters()]
    trainer = L.Trainer(
        accelerator=cfg.trainer.accelerator, devices=1, precision=cfg.trainer.precision, max_steps=STEPS,
        limit_val_batches=0, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
        default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(model, datamodule=datamodule)

    # The splits live on the GPU, and the loader's batches come from there: no host copy per step.
    splits = (datamodule.train_set, datamodule.val_set)
    assert {tensor.device.type for split in splits for tensor in split.tensors} == {"cuda"}
    images, labels = next(iter(datamodule.train_dataloader()))
    assert images.device.type == labels.device.type == "cuda"
    # bf16 autocast: the logits in bfloat16; the weights stay float32 on the GPU, finite, and trained.
    assert trainer.global_step == STEPS and len(seen) >= STEPS
    assert set(seen) == {("cuda", torch.bfloat16)}
    assert all(p.dtype == torch.float32 and p.device.type == "cuda" for p in model.parameters())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(before, p.detach().cpu()) for before, p in zip(initial, model.parameters()))
