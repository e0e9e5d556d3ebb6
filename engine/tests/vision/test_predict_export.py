"""The image machinery's prediction and export (``ddp_engine.vision``) in process: the inputs found,
read and refused, the command lines of the image test task checked before launch, every replica's
rows put back in input order, the CSV written whole, and exported files that compute the module's
logits (and a changed one caught). The commands themselves run in test_predict_export_cli.py."""

import csv
import gzip
import importlib.util
import os
from functools import partial

import lightning as L
import numpy as np
import onnx
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from onnx import numpy_helper
from torchvision.io import encode_jpeg, write_png
from vision_task.classifier import ImageClassifier
from vision_task.task import TASK

from ddp_engine.api import register
from ddp_engine.config.command_line import check_command_line
from ddp_engine.config.schema import register_configs
from ddp_engine.core import files as outputs
from ddp_engine.core.errors import CheckpointError, ConfigValueError, ExportError, UsageError
from ddp_engine.core.files import atomic_path
from ddp_engine.data.sharding import UnpaddedDistributedSampler
from ddp_engine.models.build import build_model
from ddp_engine.vision import export
from ddp_engine.vision.export import PixelClassifier, check_exported, export_model, load_exported
from ddp_engine.vision.export_format import SUFFIXES, ExportFormat, check_exporter, check_output
from ddp_engine.vision.inputs import InputImages, check_inputs, list_inputs
from ddp_engine.vision.networks import ResNet
from ddp_engine.vision.predict import COLUMNS, in_input_order, write_predictions
from ddp_engine.vision.spec import DataSpec

DIGITS = [str(digit) for digit in range(10)]
#: Gray 28x28 images of ten classes, with statistics other than those of the exported module's
#: data (so that the normalization shows).
SPEC = DataSpec(DIGITS, (1, 28, 28), (0.2,), (0.4,))
EXPORTED = DataSpec(DIGITS, (1, 28, 28), (0.1307,), (0.3081,))


def normalize(pixels: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    """``(N, H, W)`` uint8 -> ``(N, 1, H, W)`` float32: one gray channel's normalization, written out."""
    return (pixels.unsqueeze(1).float() / 255 - mean) / std


def write_idx(path, array: np.ndarray) -> None:
    """Write a uint8 array in the IDX format (big-endian header, magic 0x08 0x0N)."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def random_pixels(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def test_pixels() -> torch.Tensor:
    """64 gray 28x28 images, ``(64, 28, 28)`` uint8: a bright 8x8 patch on dark noise, at a place of its own."""
    pixels = random_pixels(64, 28, 28, seed=2) // 4
    for index, image in enumerate(pixels):
        top, left = divmod(index, 8)
        image[top * 2 + 3 : top * 2 + 11, left * 2 + 3 : left * 2 + 11] = 255 - index
    return pixels


def png_folder(folder, pixels: torch.Tensor, names: list[str]):
    """PNGs ``folder/<name>`` of ``pixels``: ``(N, H, W)`` gray or ``(N, C, H, W)``."""
    for name, image in zip(names, pixels):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        write_png(image if image.dim() == 3 else image.unsqueeze(0), str(folder / name))
    return folder


def test_inputs_are_named_in_order_and_read_as_in_training(tmp_path):
    pixels = random_pixels(4, 28, 28)
    folder = png_folder(tmp_path / "images", pixels, ["b.png", "a/z.PNG", "a/c.png", "d.png"])
    (folder / "notes.txt").write_text("not an image")
    (folder / "e.jpg").write_bytes(encode_jpeg(pixels[0].unsqueeze(0)).numpy().tobytes())
    # Relative paths, sorted; other files left out.
    assert list_inputs(folder) == ["a/c.png", "a/z.PNG", "b.png", "d.png", "e.jpg"]
    assert list_inputs(folder / "b.png") == ["b.png"]
    images = InputImages(folder, SPEC)
    (batch,) = images.__getitems__([1, 2])  # a/z.PNG, b.png: PNG is lossless
    assert torch.equal(batch, normalize(pixels[[1, 0]], 0.2, 0.4)) and batch.shape == (2, 1, 28, 28)
    # An IDX file, gzipped as MNIST ships: its images by index.
    idx = tmp_path / "images-idx3-ubyte"
    write_idx(idx, random_pixels(5, 28, 28, seed=1).numpy())
    (tmp_path / "images-idx3-ubyte.gz").write_bytes(gzip.compress(idx.read_bytes()))
    assert list_inputs(tmp_path / "images-idx3-ubyte.gz") == ["0", "1", "2", "3", "4"]
    (batch,) = InputImages(tmp_path / "images-idx3-ubyte.gz", SPEC).__getitems__([4, 0])
    assert torch.equal(batch, normalize(random_pixels(5, 28, 28, seed=1)[[4, 0]], 0.2, 0.4))


def test_inputs_the_model_cannot_take_are_refused_naming_the_file(tmp_path):
    def refused(path, match, world_size=1):
        with pytest.raises(UsageError, match=match):
            check_inputs(path, world_size, SPEC)

    refused(tmp_path / "none", r"input=.*none: no such file or folder")
    (tmp_path / "empty").mkdir()
    refused(tmp_path / "empty", r"holds no PNG or JPEG image .*Point input at a folder")
    (tmp_path / "empty" / "a.bmp").write_bytes(b"BM")
    refused(tmp_path / "empty", r"holds no PNG or JPEG image .*\(it holds 1 other file, such as a.bmp\)")
    large = png_folder(tmp_path / "large", torch.zeros(1, 28, 28, dtype=torch.uint8), ["ok.png"])
    write_png(torch.zeros(1, 32, 32, dtype=torch.uint8), str(large / "big.png"))
    refused(large, r"big.png: 32x32 gray, and the model takes 28x28 gray images, .* or pass resize=true")
    write_png(torch.zeros(3, 28, 28, dtype=torch.uint8), str(large / "big.png"))
    refused(large, r"big.png: 28x28 RGB, and the model takes 28x28 gray images")
    assert check_inputs(large, 1, SPEC, resize=True) == ["big.png", "ok.png"]
    broken = png_folder(tmp_path / "broken", torch.zeros(1, 28, 28, dtype=torch.uint8), ["ok.png"])
    (broken / "cut.png").write_bytes((broken / "ok.png").read_bytes()[:40])
    refused(broken, r"cut.png cannot be decoded as an image \(.+\)\. Replace it with a PNG or JPEG image, or remove it")
    write_idx(tmp_path / "big-idx3", np.zeros((3, 32, 32)))
    refused(tmp_path / "big-idx3", r"big-idx3 \(its images\): 32x32 gray, and the model takes 28x28 gray images")
    write_idx(tmp_path / "labels-idx1", np.zeros(3))
    refused(tmp_path / "labels-idx1", r"labels-idx1 is not an IDX file of uint8 images")
    # Every replica predicts at least one input.
    write_idx(tmp_path / "one-idx3", np.zeros((1, 28, 28)))
    refused(tmp_path / "one-idx3", r"holds 1 input, fewer than the world_size=2 .*\(trainer.devices=1\)", world_size=2)
    assert check_inputs(tmp_path / "one-idx3", 1, SPEC) == ["0"]


@pytest.fixture(scope="module")
def folder_data(image_folder, tmp_path_factory) -> list[str]:
    """The overrides that point a command at the image folder (its survey kept in a folder of its own)."""
    return ["data=folder", f"data.root={image_folder}", f"data.cache_dir={tmp_path_factory.mktemp('cache')}"]


@pytest.fixture(scope="module")
def checkpoint(folder_data, tmp_path_factory):
    """A real checkpoint of the test task's default model (the MLP): trained two steps by Lightning in
    this process on the image folder, saved by ``trainer.save_checkpoint``."""
    # Registered here too: a module's fixture runs before the test's own (conftest.py's test_task).
    register(TASK)
    register_configs()
    with initialize_config_dir(config_dir=str(TASK.configs()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=folder_data)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False,
                        num_sanity_val_steps=0, limit_val_batches=0)  # fmt: skip
    datamodule = instantiate(cfg.data)
    trainer.fit(build_model(cfg.model, datamodule.spec), datamodule=datamodule)
    path = tmp_path_factory.mktemp("checkpoint") / "last.ckpt"
    trainer.save_checkpoint(path)
    return path


def test_the_command_lines_are_checked_before_launch(checkpoint, folder_data, tmp_path):
    # The folder's images are 32x32 RGB.
    folder = png_folder(tmp_path / "images", random_pixels(3, 3, 32, 32), ["0.png", "1.png", "2.png"])
    predict = ["trainer.accelerator=cpu", "trainer.devices=2", f"ckpt_path={checkpoint}", *folder_data]
    check_command_line("predict", [*predict, f"input={folder}"])
    with pytest.raises(UsageError, match=r"Missing value \(\?\?\?\) for input"):
        check_command_line("predict", predict)
    write_png(torch.zeros(3, 20, 32, dtype=torch.uint8), str(folder / "3.png"))
    with pytest.raises(UsageError, match="3.png: 20x32 RGB, and the model takes 32x32 RGB"):
        check_command_line("predict", [*predict, f"input={folder}"])
    # The checkpoint is checked as eval checks it (the same code): another model's, "last". (The
    # folder's data.root has no default: each command line gives it, so that the check reached is the checkpoint's.)
    with pytest.raises(CheckpointError, match="was saved from another model configuration"):
        check_command_line("export", [f"ckpt_path={checkpoint}", *folder_data, "model=resnet"])
    with pytest.raises(UsageError, match="ckpt_path=last: prediction needs a checkpoint file"):
        check_command_line("predict", ["trainer.accelerator=cpu", "ckpt_path=last", f"input={folder}", *folder_data])
    with pytest.raises(UsageError, match="ckpt_path=last: export needs a checkpoint file"):
        check_command_line("export", ["ckpt_path=last", *folder_data])
    with pytest.raises(UsageError, match=r"format=pickle: the export writes onnx, torch_export\."):
        check_command_line("export", [f"ckpt_path={checkpoint}", *folder_data, "format=pickle"])
    export = [f"ckpt_path={checkpoint}", *folder_data, "format=torch_export"]
    check_command_line("export", export)  # beside the checkpoint: last.pt2
    (checkpoint.parent / "last.pt2").write_bytes(b"earlier")
    try:
        with pytest.raises(ConfigValueError, match=r"output=.*last.pt2 exists, and an export never overwrites a file"):
            check_command_line("export", export)
    finally:
        (checkpoint.parent / "last.pt2").unlink()
    check_command_line("export", [*export, f"output={tmp_path / 'new' / 'model.pt2'}"])


def shards(count: int, world_size: int) -> list[list[int]]:
    """The input indices of each replica, as the prediction's loader shards them."""
    return [list(UnpaddedDistributedSampler(range(count), world_size, rank)) for rank in range(world_size)]


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_replicas_rows_come_back_in_input_order_once_each(world_size):
    count = 101
    shard = -(-count // world_size)
    gathered = torch.full((world_size, shard), -1, dtype=torch.int64)
    for rank, indices in enumerate(shards(count, world_size)):
        gathered[rank, : len(indices)] = torch.tensor(indices)
    indices = gathered.reshape(-1)
    # Each row's class and probability derive from its input index, so that a misplaced row shows.
    classes, probabilities = indices.clamp(min=0) % 10, indices.clamp(min=0) / 1000
    ordered_classes, ordered_probabilities = in_input_order(indices, classes, probabilities, count)
    assert torch.equal(ordered_classes, torch.arange(count) % 10)
    assert torch.equal(ordered_probabilities, torch.arange(count) / 1000)
    duplicated = torch.cat([indices, torch.tensor([7])])
    with pytest.raises(RuntimeError, match="102 rows for 101 inputs: 0 missing, 1 predicted more than once"):
        in_input_order(duplicated, duplicated % 10, duplicated / 1000, count)
    with pytest.raises(RuntimeError, match="100 rows for 101 inputs: 1 missing"):
        in_input_order(indices[indices != 50], classes[indices != 50], probabilities[indices != 50], count)


def test_the_predictions_csv_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "predictions.csv"
    write_predictions(path, ["a/0.png", "1.png"], torch.tensor([3, 9]), torch.tensor([0.5, 0.9999999]), DIGITS)
    with open(path, newline="") as file:
        assert list(csv.reader(file)) == [
            list(COLUMNS),
            ["a/0.png", "3", "3", "0.500000"],
            ["1.png", "9", "9", "1.000000"],
        ]
    assert os.listdir(tmp_path) == ["predictions.csv"]

    # A process killed while writing: the complete file from before stays.
    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(outputs.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_predictions(path, ["x"], torch.tensor([1]), torch.tensor([0.7]), DIGITS)
    assert path.read_text().splitlines()[1:] == ["a/0.png,3,3,0.500000", "1.png,9,9,1.000000"]
    assert os.listdir(tmp_path) == ["predictions.csv"]  # the interrupted write's temporary file is gone too


@pytest.fixture(scope="module")
def module() -> ImageClassifier:
    """A freshly built small ResNet, with BatchNorm (random running statistics: eval mode uses them)."""
    torch.manual_seed(0)
    net = ResNet(1, (28, 28), 10, widths=(4, 8, 8))
    for norm in (layer for layer in net.modules() if isinstance(layer, torch.nn.BatchNorm2d)):
        norm.running_mean.uniform_(-0.5, 0.5)
        norm.running_var.uniform_(0.5, 2.0)
    optimizer = partial(torch.optim.SGD, lr=0.1)
    return ImageClassifier(net, optimizer=optimizer, scheduler=None, data_spec=EXPORTED).eval()


@pytest.mark.parametrize("export_format", list(ExportFormat), ids=lambda export_format: export_format.value)
def test_an_exported_model_computes_the_modules_logits_and_a_changed_one_is_caught(
    export_format, module, test_pixels, tmp_path
):
    path = tmp_path / f"model{SUFFIXES[export_format]}"
    images = test_pixels.unsqueeze(1)
    export_model(PixelClassifier(module.net, EXPORTED).eval(), export_format, path, images, DIGITS)
    with torch.no_grad():
        expected = module(normalize(test_pixels, 0.1307, 0.3081))
    assert check_exported(export_format, path, images, expected) <= 1e-5
    # The batch dimension is dynamic; the class names travel with the file.
    loaded = load_exported(export_format, path)
    assert loaded(images[:1]).shape == (1, 10) and loaded(images[:3]).shape == (3, 10)
    if export_format is ExportFormat.onnx:
        metadata = {prop.key: prop.value for prop in onnx.load(path).metadata_props}
        stored = metadata[export.CLASS_NAMES_KEY]
    else:
        extra = {export.CLASS_NAMES_KEY: ""}
        torch.export.load(path, extra_files=extra)
        stored = extra[export.CLASS_NAMES_KEY]
    assert stored == '["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]'

    # One weight changed by 0.01 in the file: its logits no longer match.
    if export_format is ExportFormat.onnx:
        model = onnx.load(path)
        weight = next(tensor for tensor in model.graph.initializer if numpy_helper.to_array(tensor).ndim == 4)
        weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) + 0.01, weight.name))
        onnx.save(model, path)
    else:
        program = torch.export.load(path)
        with torch.no_grad():
            next(tensor for tensor in program.state_dict.values() if tensor.ndim == 4).add_(0.01)
        torch.export.save(program, path)
    with pytest.raises(
        ExportError, match=r"computes other logits than the checkpoint's model: max \|difference\| \S+ on 64"
    ):
        check_exported(export_format, path, images, expected)


def test_an_export_never_replaces_a_file_and_names_a_missing_package(tmp_path, monkeypatch):
    existing = tmp_path / "model.onnx"
    existing.write_bytes(b"earlier")
    with pytest.raises(FileExistsError), atomic_path(existing, suffix=".onnx", replace=False) as temporary:
        temporary.write_bytes(b"new")
    assert existing.read_bytes() == b"earlier" and os.listdir(tmp_path) == ["model.onnx"]
    with pytest.raises(ConfigValueError, match=r"output=.*model.onnx exists, and an export never overwrites a file"):
        check_output(existing)
    with atomic_path(tmp_path / "other.onnx", suffix=".onnx", replace=False) as temporary:
        temporary.write_bytes(b"new")
    assert (tmp_path / "other.onnx").read_bytes() == b"new" and sorted(os.listdir(tmp_path)) == [
        "model.onnx",
        "other.onnx",
    ]

    check_exporter(ExportFormat.onnx)  # installed here (the dev extra)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "onnxscript" else find_spec(name))
    with pytest.raises(
        ExportError,
        match=r"format=onnx needs .* onnxscript is not installed: pip install onnx onnxruntime onnxscript \(or format=",
    ):
        check_exporter(ExportFormat.onnx)
    check_exporter(ExportFormat.torch_export)  # torch alone
