"""Swapping the data set is a config change only: any data set in MNIST's file format (four IDX files,
28x28 uint8 images, ten classes) trains through the same DataModule once its folder, file names,
class names and normalization statistics are set on the command line or in ``conf/data/``.

The data set here is synthetic (no other IDX data set exists on this machine): the synthetic
MNIST-format digits of helpers.py, inverted to dark patches on a light background (so their
statistics are far from MNIST's), under other file names, in a folder of their own, configured by
the README's own example, ``conf/data/letters.yaml``.
"""

import re
import shutil

import numpy as np
import pytest
import torch
from ddp_engine.config.command_line import check_command_line
from ddp_engine.config.saved_run import data_set_of_run, run_config_path, saved_run_config
from ddp_engine.config.schema import register_configs
from ddp_engine.core.errors import ConfigValueError, DataFormatError, DataNotAvailableError, UsageError
from ddp_engine.vision.idx import import_class
from ddp_engine.vision.spec import CHECKPOINT_KEY
from helpers import CONFIG_DIR, IDX_DATA, REPO, fit_and_test_in_process, write_idx
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torchvision.datasets import FashionMNIST
from torchvision.datasets.mnist import read_image_file

from mnist_ddp.data import MNISTDataModule

register_configs()

FILES = {
    "train_images": "letters-train-images.idx3",
    "train_labels": "letters-train-labels.idx1",
    "test_images": "letters-test-images.idx3",
    "test_labels": "letters-test-labels.idx1",
}
CLASS_NAMES = list("ABCDEFGHIJ")


def idx_array(path) -> np.ndarray:
    """The array of an IDX file of uint8 (header: 4 magic bytes, then one 4-byte size per dimension)."""
    data = path.read_bytes()
    ndim = data[3]
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data[4 + 4 * ndim :], np.uint8).reshape(shape)


@pytest.fixture(scope="module")
def letters_dir(synthetic_data_dir, tmp_path_factory):
    """The synthetic set as another data set: inverted pixels, its own file names, files directly in the folder."""
    folder = tmp_path_factory.mktemp("letters")
    raw = synthetic_data_dir / "MNIST" / "raw"
    for role, mnist_name in (("train_images", "train-images-idx3-ubyte"), ("test_images", "t10k-images-idx3-ubyte")):
        write_idx(folder / FILES[role], 255 - idx_array(raw / mnist_name))
    shutil.copy(raw / "train-labels-idx1-ubyte", folder / FILES["train_labels"])
    shutil.copy(raw / "t10k-labels-idx1-ubyte", folder / FILES["test_labels"])
    return folder


def letters_overrides(folder, mean: float, std: float) -> list[str]:
    names = ",".join(CLASS_NAMES)
    return [
        f"data.data_dir={folder}", "data.subdir=.", "data.download=null", f"data.class_names=[{names}]",
        f"data.mean={mean}", f"data.std={std}", "data.val_size=200", "data.global_batch_size=32",
        *(f"data.files.{role}={name}" for role, name in FILES.items()),
    ]  # fmt: skip


def compose_config(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=[IDX_DATA, *overrides])


@pytest.fixture
def readme_config(tmp_path) -> list[str]:
    """The README's example ``conf/data/letters.yaml``, as printed there, in a config folder Hydra
    also searches: returns the overrides that select it."""
    readme = (REPO / "README.md").read_text()
    (example,) = re.findall(r"```yaml\n(# conf/data/letters\.yaml.*?)```", readme, re.DOTALL)
    (tmp_path / "conf" / "data").mkdir(parents=True)
    (tmp_path / "conf" / "data" / "letters.yaml").write_text(example)
    return ["data=letters", f"hydra.searchpath=[file://{tmp_path / 'conf'}]"]


def test_an_idx_data_set_trains_by_configuration_alone(letters_dir, readme_config, tmp_path):
    pixels = idx_array(letters_dir / FILES["train_images"]) / 255.0
    mean, std = round(float(pixels.mean()), 4), round(float(pixels.std()), 4)
    assert mean > 0.7, "inverted digits: far from MNIST's mean 0.1307"
    cfg = compose_config(*readme_config, f"data.data_dir={letters_dir}", f"data.mean={mean}", f"data.std={std}",
                         "data.val_size=200", "data.global_batch_size=32")  # fmt: skip
    assert dict(cfg.data.files) == FILES and list(cfg.data.class_names) == CLASS_NAMES
    datamodule, test = fit_and_test_in_process(cfg, tmp_path)

    # Served as (pixel / 255 - mean) / std with the configured statistics: the test split exactly.
    test_pixels = torch.from_numpy(idx_array(letters_dir / FILES["test_images"]).copy())
    images, labels = datamodule.test_set.tensors
    assert torch.equal(images, test_pixels.unsqueeze(1))
    assert torch.allclose(datamodule.spec.normalize(images), (test_pixels.unsqueeze(1).float() / 255 - mean) / std)
    assert torch.equal(labels, torch.from_numpy(idx_array(letters_dir / FILES["test_labels"]).astype(np.int64)))
    assert datamodule.class_names == CLASS_NAMES
    # Bright squares -> dark squares: still one position per class; 2% of the test labels are noise.
    assert test["test/acc"] >= 0.9, test


def test_the_readme_example_as_printed_asks_for_its_statistics(readme_config):
    # Its mean and std are ??? over idx.yaml's ???: a forgotten value cannot fall back to MNIST's.
    with pytest.raises(UsageError, match=re.escape("Missing values (???) for data.mean, data.std: set them")):
        check_command_line("config", readme_config)


def test_files_missing_without_a_download_name_the_files_and_the_setting(letters_dir, tmp_path):
    cfg = compose_config(*letters_overrides(tmp_path / "empty", 0.5, 0.5))
    with pytest.raises(DataNotAvailableError) as error:
        instantiate(cfg.data).prepare_data()
    message = str(error.value)
    assert all(name in message for name in FILES.values()) and "data.download=null" in message
    assert not (tmp_path / "empty").exists(), "nothing is created for a data set that cannot be downloaded"


def write_split(folder, images: np.ndarray, labels: np.ndarray) -> dict[str, str]:
    for role in ("train", "test"):
        write_idx(folder / FILES[f"{role}_images"], images)
        write_idx(folder / FILES[f"{role}_labels"], labels)
    return FILES


@pytest.mark.parametrize(
    ("images_shape", "labels", "message"),
    [
        ((20, 32, 32), np.zeros(20), "holds 32x32 images; data.image_size is 28x28. Set data.image_size=[32,32]"),
        ((20, 28, 28), np.zeros(19), "holds 20 images but"),
        ((20, 28, 28), np.full(20, 10), "has labels 10..10; data.class_names names 10 classes (labels 0..9)"),
        ((20, 28), np.zeros(20), "is not an IDX file of uint8 images (N, H, W)"),
    ],
)
def test_a_data_set_that_does_not_fit_its_config_is_refused_naming_the_file(tmp_path, images_shape, labels, message):
    write_split(tmp_path, np.zeros(images_shape), labels)
    datamodule = MNISTDataModule(str(tmp_path), val_size=5, subdir=".", files=FILES, download=None)
    with pytest.raises(DataFormatError, match=re.escape(message)) as error:
        datamodule.prepare_data()  # before any process starts
    assert str(tmp_path) in str(error.value)


def test_an_idx_data_set_of_other_classes_and_size_describes_itself(tmp_path):
    # Five classes of 32x32 images: the network is built for what the config declares.
    write_split(tmp_path, np.zeros((20, 32, 32)), np.arange(20) % 5)
    datamodule = MNISTDataModule(str(tmp_path), val_size=5, subdir=".", files=FILES, download=None,
                                 class_names=list("ABCDE"), image_size=[32, 32], mean=0.5, std=0.25)  # fmt: skip
    datamodule.prepare_data()
    spec = datamodule.spec
    assert (spec.class_names, spec.input_shape, spec.mean, spec.std) == (tuple("ABCDE"), (1, 32, 32), (0.5,), (0.25,))
    assert spec.network_arguments() == {"in_channels": 1, "image_size": [32, 32], "num_classes": 5}
    with pytest.raises(ConfigValueError, match="data.class_names is empty"):
        MNISTDataModule(str(tmp_path), class_names=[])


@pytest.mark.parametrize("download", ["torchvision.datasets.Nope", "nowhere.MNIST", "torchvision.datasets.mnist"])
def test_a_download_that_names_no_class_is_refused(tmp_path, download):
    with pytest.raises(ConfigValueError, match=f"data.download={download} is not an importable class"):
        MNISTDataModule(str(tmp_path), download=download)


def test_fashion_mnist_is_a_config_file_over_the_same_datamodule():
    cfg = compose_config("data=fashion_mnist")
    assert cfg.data._target_ == "mnist_ddp.data.MNISTDataModule"
    assert cfg.data.class_names == FashionMNIST.classes
    assert import_class(cfg.data.download) is FashionMNIST
    # torchvision downloads into <root>/FashionMNIST/raw, which is where the DataModule reads.
    assert cfg.data.subdir == f"{FashionMNIST.__name__}/raw"
    assert dict(cfg.data.files) == dict(compose_config().data.files)
    assert (cfg.data.mean, cfg.data.std) == (0.2860, 0.3530)


def test_mnist_statistics_in_the_config_are_those_of_the_training_images(mnist_data_dir):
    # The README's recipe for a new data set's data.mean / data.std, on the real MNIST files.
    pixels = read_image_file(str(mnist_data_dir / "MNIST" / "raw" / "train-images-idx3-ubyte")).float() / 255
    cfg = compose_config()
    assert (round(pixels.mean().item(), 4), round(pixels.std().item(), 4)) == (cfg.data.mean, cfg.data.std)


# --- evaluation on the data set a checkpoint's run trained on ------------------------------------


def test_eval_takes_the_data_set_of_the_checkpoints_run(letters_dir, checkpoint, tmp_path):
    # A run trained on the letters (its config as Hydra saves it, and a checkpoint of its model),
    # evaluated by a command whose own data defaults are MNIST's.
    trained = checkpoint
    checkpoint = tmp_path / "run" / "checkpoints" / "last.ckpt"
    (tmp_path / "run" / ".hydra").mkdir(parents=True)
    checkpoint.parent.mkdir()
    run_config = compose_config(*letters_overrides(letters_dir, 0.75, 0.4))
    OmegaConf.save(run_config, run_config_path(checkpoint))
    # The checkpoint keeps the data spec of the data set it was trained on: the letters'.
    state = torch.load(trained, weights_only=True)
    state[CHECKPOINT_KEY] = instantiate(run_config.data).spec.to_dict()
    torch.save(state, checkpoint)
    command = [f"ckpt_path={checkpoint}", f"data.data_dir={letters_dir}"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("eval", overrides=command)
    assert cfg.data.class_names == [str(digit) for digit in range(10)], "this command's own default"

    taken = data_set_of_run(cfg, saved_run_config(checkpoint), checkpoint, command)
    assert "data.mean=0.75" in taken and "data.subdir=." in taken
    assert (cfg.data.class_names, cfg.data.mean, cfg.data.std) == (CLASS_NAMES, 0.75, 0.4)
    assert cfg.data.data_dir == str(letters_dir), "where the files are: this command's own"
    datamodule = instantiate(cfg.data)
    datamodule.setup("test")
    letters = torch.from_numpy(idx_array(letters_dir / FILES["test_images"]).copy())
    assert torch.equal(datamodule.test_set.tensors[0], letters.unsqueeze(1)), "the run's files"
    assert datamodule.spec.mean == (0.75,) and datamodule.spec.std == (0.4,), "and statistics"

    # An override that contradicts the run is refused, naming both values, before anything starts;
    # one that agrees is fine, and so is a process count that does not divide the global batch.
    for override, given in (("data.mean=0.5", "data.mean=0.5"), ("data=fashion_mnist", "data=fashion_mnist (data.")):
        with pytest.raises(UsageError, match="the checkpoint's run trained on data.") as error:
            check_command_line("eval", ["trainer.accelerator=cpu", *command, override])
        assert str(error.value).startswith(given) and str(run_config_path(checkpoint)) in str(error.value)
    check_command_line("eval", ["trainer.accelerator=cpu", "trainer.devices=3", *command, "data.mean=0.75"])

    # Without a run config, the command's own data set, unchanged.
    alone = tmp_path / "alone.ckpt"
    assert data_set_of_run(cfg, saved_run_config(alone), alone, [f"ckpt_path={alone}"]) == []
