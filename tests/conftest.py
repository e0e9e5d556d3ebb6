"""Shared fixtures: synthetic MNIST-format data, the offline real MNIST copy, the DDP runs several
test files check, a local download mirror, a real checkpoint. The functions behind them, and every
other helper a test imports, are in helpers.py."""

import os
import subprocess
from pathlib import Path

import lightning as L
import pytest
from ddp_engine.api import register
from ddp_engine.config.schema import register_configs
from ddp_engine.models.build import build_model
from ddp_engine.vision.idx import MNIST_FILES
from ddp_engine.vision.mirror import local_mirror
from harness import supervisor_imports
from helpers import (
    CONFIG_DIR,
    DETERMINISTIC,
    IDX_DATA,
    REPO,
    TEMPLATE_TASK,
    TEST_SIZE,
    TRAIN_SIZE,
    VAL_SIZE,
    cli_command,
    cli_env,
    make_synthetic_mnist,
    run_cli,
)
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from torchvision.datasets import MNIST

from mnist_ddp.task import TASK

# The engine composes a config with the task's configs and schemas: the task's entry points
# register it (ddp_engine.api.register), and so do the tests, which compose in their own processes too:
# at collection (a test module may compose at import) and before each test (a pytest worker also
# runs the engine's own tests, engine/tests/, which register the engine's test task).
register(TASK)


@pytest.fixture(autouse=True)
def registered_task():
    """This project's task, registered with the engine for each test."""
    register(TASK)
    register_configs()  # the task's node and schemas in Hydra's ConfigStore, where tests compose
    return TASK


@pytest.fixture(scope="session")
def synthetic_data_dir(tmp_path_factory) -> Path:
    """1,200 training and 300 test images; 2% of the test labels are noise, so a few test digits
    come out misclassified (TensorBoard's test/misclassified image is then written)."""
    return make_synthetic_mnist(tmp_path_factory.mktemp("synthetic"), test_label_noise=0.02)


@pytest.fixture(scope="session")
def synthetic_data(synthetic_data_dir) -> list[str]:
    """The overrides that point a command at :func:`synthetic_data_dir` (a validation split that
    leaves training images): the commands check the data before they start."""
    return [IDX_DATA, f"data.data_dir={synthetic_data_dir}", "data.val_size=200"]


@pytest.fixture(scope="session")
def task_overrides(synthetic_data) -> list[str]:
    """What points the task's commands at test data, for its guarantees (test_task.py): the synthetic
    MNIST files. A task of your own returns its own (or none, where its configs' data will do)."""
    return synthetic_data


@pytest.fixture(scope="session")
def synthetic_run(synthetic_data_dir, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One finished 2-epoch run with 2 gloo processes on the synthetic data, logged to TensorBoard,
    CSV and W&B (offline): (log_dir, result). The command's own process lists what it imports
    (``import_probe``, engine/tests) in ``harness.supervisor_imports(log_dir)``."""
    log_dir = tmp_path_factory.mktemp("logs")
    command = cli_command(
        f"data.data_dir={synthetic_data_dir}", "data.val_size=200", "data.global_batch_size=64",
        "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=2", "logger=[tensorboard,csv,wandb]",
        log_dir=log_dir,
    )  # fmt: skip
    command[2:2] = ["import_probe"]  # python -m import_probe mnist_ddp.train ...
    env = cli_env(IMPORT_PROBE_FILE=str(supervisor_imports(log_dir)))
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return log_dir, result


@pytest.fixture(scope="session")
def noisy_data_dir(tmp_path_factory) -> Path:
    """The synthetic data of the deterministic runs: TRAIN_SIZE + VAL_SIZE and TEST_SIZE images, 25% label noise."""
    return make_synthetic_mnist(
        tmp_path_factory.mktemp("noisy"), n_train=TRAIN_SIZE + VAL_SIZE, n_test=TEST_SIZE, label_noise=0.25
    )


@pytest.fixture(scope="session")
def deterministic_run(noisy_data_dir, tmp_path_factory):
    """``deterministic_run(name, *overrides)``: the run directory of DETERMINISTIC plus ``overrides``,
    trained once per session (on first use) and shared by every test that names it."""
    done: dict[str, tuple[tuple[str, ...], Path]] = {}

    def get(name: str, *overrides: str) -> Path:
        if name not in done:
            log_dir = tmp_path_factory.mktemp(name)
            result = run_cli(f"data.data_dir={noisy_data_dir}", *DETERMINISTIC, *overrides, log_dir=log_dir)
            assert result.returncode == 0, f"{name}:\n" + result.stdout[-3000:] + result.stderr[-5000:]
            (run_dir,) = (log_dir / "runs").iterdir()
            done[name] = (overrides, run_dir)
        assert done[name][0] == overrides, f"run {name} was trained with other overrides"
        return done[name][1]

    return get


@pytest.fixture(scope="session")
def mnist_data_dir() -> Path:
    """The real MNIST copy: ``$MNIST_DATA_DIR`` (set by .ci/run), else ``../shared/data`` if present."""
    path = Path(os.environ.get("MNIST_DATA_DIR", REPO.parent / "shared" / "data"))
    if not (path / "MNIST" / "raw" / "train-images-idx3-ubyte").is_file():
        pytest.skip(f"real MNIST not found in {path}/MNIST/raw; set MNIST_DATA_DIR to a folder that has it")
    return path


@pytest.fixture(scope="session")
def mnist_png_dir(mnist_data_dir, tmp_path_factory) -> Path:
    """The real MNIST as a folder data set: ``train/<digit>/*.png`` and ``test/<digit>/*.png``, the 70,000
    images of the IDX files written once per session (``benchmarks.pipeline.write_png_tree``)."""
    from benchmarks.pipeline import write_png_tree

    return write_png_tree(mnist_data_dir / "MNIST" / "raw", tmp_path_factory.mktemp("mnist_png") / "tree")


@pytest.fixture
def mirror(tmp_path, monkeypatch, synthetic_data_dir):
    """The synthetic files served as an MNIST mirror over HTTP on 127.0.0.1, gzipped as the real
    mirrors serve them, with their MD5s patched into torchvision's resource list in this process:
    the real download path runs offline. Yields the mirror's URL and its handler class (whose
    ``cut_off`` cuts a file's transfer off)."""
    with local_mirror(synthetic_data_dir / "MNIST" / "raw", MNIST_FILES.values(), tmp_path / "mirror") as served:
        url, handler, resources = served
        monkeypatch.setattr(MNIST, "resources", resources)
        yield url, handler


@pytest.fixture(scope="module")
def checkpoint(synthetic_data_dir, tmp_path_factory) -> Path:
    """A real checkpoint of the default model: trained two steps by Lightning in this process on
    the synthetic data, saved by ``trainer.save_checkpoint``."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        overrides = [IDX_DATA, *TEMPLATE_TASK, f"data.data_dir={synthetic_data_dir}", "data.val_size=200"]
        cfg = compose(config_name="config", overrides=overrides)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                        num_sanity_val_steps=0, limit_val_batches=0)  # fmt: skip
    datamodule = instantiate(cfg.data)
    trainer.fit(build_model(cfg.model, datamodule.spec), datamodule=datamodule)
    path = tmp_path_factory.mktemp("checkpoint") / "last.ckpt"
    trainer.save_checkpoint(path)
    return path
