"""Swapping the network is a config change only: ``model=mlp`` trains with the same DataModule,
LightningModule and Trainer as the CNN, and learns (one process, in this process: the DDP paths
are the same for every network and are tested with the CNN)."""

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from mnist_ddp.config import CONFIG_DIR, register_configs
from mnist_ddp.model import MLP

register_configs()


def test_mlp_maps_images_to_logits():
    net = MLP(hidden=(64, 32), dropout=0.0)
    assert net(torch.randn(5, 1, 28, 28)).shape == (5, 10)
    assert [layer.out_features for layer in net.modules() if isinstance(layer, torch.nn.Linear)] == [64, 32, 10]


def test_model_mlp_trains_through_the_same_datamodule_and_module(synthetic_data_dir, tmp_path):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "model=mlp", f"data.data_dir={synthetic_data_dir}", "data.val_size=200", "data.global_batch_size=32",
        ])  # fmt: skip
    assert cfg.model.net._target_ == "mnist_ddp.model.MLP"
    L.seed_everything(0)
    model, datamodule = instantiate(cfg.model), instantiate(cfg.data)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=3, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
        default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(model, datamodule=datamodule)
    (test,) = trainer.test(model, datamodule=datamodule, verbose=False)
    # The synthetic digits are bright patches whose position is the class; 2% of test labels are noise.
    assert test["test/acc"] >= 0.9, test
