"""The bad-checkpoint refusals' checkpoint: a real one of the image test task (:mod:`vision_task`,
two networks to choose from, and a data spec kept in every checkpoint), and its data set."""

from pathlib import Path

import lightning as L
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from vision_task.classifier import make_image_folder
from vision_task.task import TASK as VISION_TASK

from ddp_engine.api import register
from ddp_engine.config.schema import register_configs
from ddp_engine.models.build import build_model


@pytest.fixture(scope="session")
def image_data(tmp_path_factory) -> list[str]:
    """The overrides that point the image task at a synthetic folder of PNGs (five classes), its
    survey's cache outside the repository."""
    images = make_image_folder(tmp_path_factory.mktemp("images") / "colours")
    return [f"data.root={images}", f"data.cache_dir={tmp_path_factory.mktemp('cache')}"]


@pytest.fixture(scope="module")
def checkpoint(image_data, tmp_path_factory) -> Path:
    """A real checkpoint of the image task's default model (model=mlp): trained two steps by Lightning
    in this process on :func:`image_data`, saved by ``trainer.save_checkpoint``."""
    register(VISION_TASK)
    register_configs()
    with initialize_config_dir(config_dir=str(VISION_TASK.configs()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=image_data)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                        num_sanity_val_steps=0, limit_val_batches=0)  # fmt: skip
    datamodule = instantiate(cfg.data)
    trainer.fit(build_model(cfg.model, datamodule), datamodule=datamodule)
    path = tmp_path_factory.mktemp("checkpoint") / "last.ckpt"
    trainer.save_checkpoint(path)
    return path
