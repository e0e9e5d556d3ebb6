"""Real MNIST, two DDP processes over gloo: at least 99.0% test accuracy, from its IDX files and from
the same images as a folder of PNGs (``data=folder``); the folder's lazy path (decoded from disk by
DataLoader workers) trains the same parameters as its in-memory path.

Each runs the default one-epoch recipe (``make train``), read back from TensorBoard's event files.
"""

import pytest
import torch
from ddp_engine.config.schema import register_configs
from ddp_engine.models.build import build_model
from ddp_engine.vision.spec import read_data_spec
from harness import read_scalars
from helpers import CONFIG_DIR, run_cli
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

pytestmark = pytest.mark.processes


def default_recipe_test_accuracy(tmp_path, *data: str) -> float:
    """The default recipe on 2 gloo processes with the ``data`` overrides: the test accuracy it logged."""
    result = run_cli(*data, "trainer.accelerator=cpu", "trainer.devices=2", log_dir=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    (run,) = (tmp_path / "runs").iterdir()
    scalars = read_scalars(run / "tensorboard")
    (test_acc,) = scalars["test/acc"]
    print(f"{' '.join(data)}: test/acc={test_acc:.4f} val/acc={scalars['val/acc']}")
    assert len(scalars["val/acc"]) == 2, "one epoch, then the best checkpoint"
    return test_acc


def test_the_default_recipe_reaches_99_percent_on_the_official_test_set(mnist_data_dir, tmp_path):
    assert default_recipe_test_accuracy(tmp_path, f"data.data_dir={mnist_data_dir}") >= 0.99


def test_mnist_as_a_folder_of_pngs_reaches_99_percent_as_well(mnist_png_dir, tmp_path):
    assert default_recipe_test_accuracy(tmp_path, "data=folder", f"data.root={mnist_png_dir}") >= 0.99
    # The statistics the folder's survey computed are MNIST's published ones.
    (checkpoint,) = (next((tmp_path / "runs").iterdir()) / "checkpoints").glob("epoch_*.ckpt")
    spec = read_data_spec(checkpoint)
    assert spec.input_shape == (1, 28, 28) and spec.class_names == tuple("0123456789")
    assert (round(spec.mean[0], 4), round(spec.std[0], 4)) == (0.1307, 0.3081)


@pytest.mark.parametrize("steps", [12])
def test_the_folders_lazy_path_with_two_workers_trains_the_in_memory_parameters(mnist_png_dir, tmp_path, steps):
    import lightning as L

    register_configs()
    trained = []
    for lazy in (False, True):
        overrides = ["data=folder", f"data.root={mnist_png_dir}", f"data.cache_dir={tmp_path / 'cache'}",
                     "data.global_batch_size=32", "model.net.dropout=0"]  # fmt: skip
        if lazy:
            overrides += ["data.in_memory_limit_mib=0", "data.num_workers=2"]
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        datamodule = instantiate(cfg.data)
        assert datamodule.in_memory is not lazy
        L.seed_everything(0)
        model = build_model(cfg.model, datamodule.spec)
        trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                            limit_val_batches=0, num_sanity_val_steps=0)  # fmt: skip
        trainer.fit(model, datamodule=datamodule)
        trained.append({key: value.clone() for key, value in model.state_dict().items()})
    for key, value in trained[0].items():
        assert torch.equal(trained[1][key], value), key
