"""Swapping the network is a config change only: ``model=mlp`` trains with the same DataModule,
LightningModule and Trainer as the CNN, and learns (one process, in this process: the DDP paths
are the same for every network and are tested with the CNN)."""

import torch
from conftest import fit_and_test_in_process
from hydra import compose, initialize_config_dir

from mnist_ddp.cli.schema import CONFIG_DIR, register_configs
from mnist_ddp.models.networks import MLP

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
    assert cfg.model.net._target_ == "mnist_ddp.models.networks.MLP"
    _, test = fit_and_test_in_process(cfg, tmp_path)
    # The synthetic digits are bright patches whose position is the class; 2% of test labels are noise.
    assert test["test/acc"] >= 0.9, test
