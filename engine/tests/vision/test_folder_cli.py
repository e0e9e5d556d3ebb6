"""A folder of RGB images with five classes (not MNIST's shape, not ten classes) through the real
command lines of the image test task (``python -m vision_task.<command>``): trained by configuration
alone with a network built for 3 channels and augmentation on, a run
SIGKILLed inside an epoch resumed exactly (in place; with DataLoader workers; on another world
size), its checkpoint evaluated on 1, 2 and 3 processes, predicted and exported with nothing but
``ckpt_path``.

The data set is :func:`vision_task.classifier.make_image_folder`'s: 240 training PNGs (216 after 24 are held out for
validation: 9 global batches of 24 per epoch, which divide by 2 and 3 processes alike) and 70 test
PNGs, each a coloured patch at a random place on noise, 15% of the labels wrong so that accuracy
stays below 1 and a sample counted twice would show.
"""

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from harness import only, run_cli
from omegaconf import OmegaConf
from vision_task.classifier import make_image_folder

from ddp_engine.models.build import build_model
from ddp_engine.vision.images import decode_image_file
from ddp_engine.vision.spec import DataSpec, read_data_spec

pytestmark = pytest.mark.processes

#: Deterministic training (no dropout, SGD with momentum) on the folder, augmentation on,
#: last.ckpt every 3 optimizer steps.
FOLDER_RUN = (
    "data=folder", "data.val_size=24", "data.global_batch_size=24", "data.crop_padding=4", "data.horizontal_flip=true",
    "trainer.accelerator=cpu", "trainer.max_epochs=2", "model.net.dropout=0",
    "model.optimizer._target_=torch.optim.SGD", "model.optimizer.lr=0.05", "+model.optimizer.momentum=0.9",
    "callbacks.last_checkpoint.train_time_interval=null", "callbacks.last_checkpoint.every_n_train_steps=3",
)  # fmt: skip
STEPS_PER_EPOCH = 216 // 24
#: Rank 1 kills itself here, inside the second epoch, 1 step after the checkpoint of step 12.
KILL_STEP = 13
# Float32 sums in another order on another world size: equal to rounding.
PARAM_ATOL = 1e-5


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("colours"), counts={"train": 48, "test": 14}, label_noise=0.15)


#: Where each command writes its run directory under ``paths.log_dir``.
RUN_FOLDERS = {"train": "runs", "eval": "evals", "predict": "predictions", "export": "exports"}


@pytest.fixture(scope="module")
def runs(folder, tmp_path_factory):
    """``runs(name, *overrides, expect=0, command="train")``: ``python -m vision_task.<command>`` with
    ``overrides`` (training: :data:`FOLDER_RUN` on the folder first), run once per name: ``(its run
    directory, the command's result)``. A training's ``hydra.run.dir`` is its own run directory."""
    done = {}

    def run(name, *overrides, expect=0, command="train"):
        if name not in done:
            log_dir = tmp_path_factory.mktemp(name)
            base = (*FOLDER_RUN, f"data.root={folder}") if command == "train" else ()
            result = run_cli(f"vision_task.{command}", *base, *overrides, log_dir=log_dir)
            assert result.returncode == expect, f"{name}:\n" + result.stdout[-3000:] + result.stderr[-3000:]
            given = [arg.split("=", 1)[1] for arg in overrides if arg.startswith("hydra.run.dir=")]
            done[name] = (Path(given[0]) if given else only(log_dir / RUN_FOLDERS[command]), result)
        return done[name]

    return run


def params(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def killed(runs, tmp_path_factory):
    """The run whose rank 1 is SIGKILLed at :data:`KILL_STEP`, and a copy of its last.ckpt (step 12)."""
    run_dir, result = runs(
        "killed", "trainer.devices=2", "+callbacks.kill._target_=probes.ElasticProbe",
        "+callbacks.kill.record=${paths.output_dir}/record.jsonl", "+callbacks.kill.kill_rank=1",
        f"+callbacks.kill.kill_step={KILL_STEP}", expect=1,
    )  # fmt: skip
    assert result.stdout.strip().splitlines()[-1].endswith("rank 1 failed: killed by SIGKILL (exit status -9)")
    copy = tmp_path_factory.mktemp("saved") / "step12.ckpt"
    shutil.copy(run_dir / "checkpoints" / "last.ckpt", copy)
    state = torch.load(copy, weights_only=True)
    assert (state["epoch"], state["global_step"]) == (1, 12), "inside the second epoch"
    assert state["ImageFolderDataModule"]["train_position"] == {"epoch": 1, "samples": 3 * 24, "global_batch_size": 24}
    return run_dir, copy


def test_a_folder_of_rgb_images_trains_a_network_built_for_three_channels_by_configuration(runs, folder):
    run_dir, result = runs("full", "trainer.devices=2")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    spec = read_data_spec(run_dir / "checkpoints" / "last.ckpt")
    assert spec.class_names == ("blue", "green", "magenta", "red", "yellow") and spec.input_shape == (3, 32, 32)
    state = params(run_dir)
    # The MLP's first layer takes the 3 x 32 x 32 pixels; its last gives the 5 classes.
    assert state["net.layers.1.weight"].shape == (64, 3 * 32 * 32) and state["net.layers.4.weight"].shape == (5, 64)
    # The colours are learnt in two epochs; 15% of the test labels are wrong.
    assert 0.6 <= metrics["test/acc"] < 1, metrics
    # Nothing was written into the data folder; the survey went into the log folder's cache.
    assert sorted(path.name for path in folder.iterdir()) == ["test", "train"]
    assert len(list((run_dir.parent.parent / ".cache").glob("folder-survey-*.json"))) == 1


def test_a_run_killed_inside_an_epoch_resumes_exactly_with_augmentation(runs, killed):
    full, _ = runs("full", "trainer.devices=2")
    run_dir, saved = killed
    # In place, as the log's resume command says: bit-identical to the uninterrupted run.
    # (The kill callback stays in the run's overrides; no step is -1.)
    runs("in_place", f"hydra.run.dir={run_dir}", "ckpt_path=last", "+callbacks.kill.kill_step=-1")
    for key, value in params(full).items():
        assert torch.equal(params(run_dir)[key], value), key
    # With 2 DataLoader workers: the same augmented batches, bit-identical again.
    workers, _ = runs("workers", "trainer.devices=2", "data.num_workers=2", f"ckpt_path={saved}")
    for key, value in params(full).items():
        assert torch.equal(params(workers)[key], value), key
    # On 3 processes: the same global batches in another float32 summation order.
    three, _ = runs("three", "trainer.devices=3", f"ckpt_path={saved}")
    difference = max((params(full)[key] - params(three)[key]).abs().max().item() for key in params(full))
    print(f"resumed on 3 processes from step 12: max |parameter difference| {difference:.3g}")
    assert difference < PARAM_ATOL
    assert torch.load(three / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2 * STEPS_PER_EPOCH


def test_its_checkpoint_evaluates_alike_on_1_2_and_3_processes_with_only_ckpt_path(runs, folder):
    full, _ = runs("full", "trainer.devices=2")
    trained = json.loads((full / "metrics.json").read_text())  # the run's own test, on 2 processes
    (best,) = (full / "checkpoints").glob("epoch_*.ckpt")
    evaluation, _ = runs("eval3", "trainer.accelerator=cpu", "trainer.devices=3", f"ckpt_path={best}", command="eval")
    metrics = json.loads((evaluation / "metrics.json").read_text())
    assert metrics["world_size"] == 3 and metrics["test/acc"] == trained["test/acc"]
    assert metrics["test/loss"] == pytest.approx(trained["test/loss"], abs=1e-6)
    # One process: the same checkpoint on every test image here, in this process.
    module, spec = module_of(full, best)
    files = sorted((folder / "test").rglob("*.png"))
    labels = torch.tensor([spec.class_names.index(path.parent.name) for path in files])
    with torch.no_grad():
        logits = module(spec.normalize(torch.stack([decode_image_file(path) for path in files])))
    assert (logits.argmax(1) == labels).float().mean().item() == pytest.approx(trained["test/acc"], abs=1e-7)


def module_of(run_dir, checkpoint=None):
    """The run's LightningModule with the weights of ``checkpoint`` (default its last.ckpt), built as the
    commands build it, in eval mode, and its data spec."""
    checkpoint = checkpoint or run_dir / "checkpoints" / "last.ckpt"
    spec = read_data_spec(checkpoint)
    module = build_model(OmegaConf.load(run_dir / ".hydra" / "config.yaml").model, spec)
    module.load_state_dict(torch.load(checkpoint, weights_only=True)["state_dict"])
    return module.eval(), spec


def test_predict_and_export_of_the_run_match_its_module(runs, folder):
    full, _ = runs("full", "trainer.devices=2")
    module, spec = module_of(full)
    assert isinstance(spec, DataSpec)
    files = sorted((folder / "test").rglob("*.png"))
    pixels = torch.stack([decode_image_file(path) for path in files])
    with torch.no_grad():
        logits = module(spec.normalize(pixels))

    checkpoint = f"ckpt_path={full / 'checkpoints' / 'last.ckpt'}"
    prediction, _ = runs("predict", "trainer.accelerator=cpu", "trainer.devices=2", checkpoint,
                         f"input={folder / 'test'}", command="predict")  # fmt: skip
    with open(prediction / "predictions.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [row["input"] for row in rows] == [path.relative_to(folder / "test").as_posix() for path in files]
    probabilities, classes = logits.softmax(dim=1).max(dim=1)
    assert [row["class_name"] for row in rows] == [spec.class_names[index] for index in classes.tolist()]
    assert np.allclose([float(row["probability"]) for row in rows], probabilities.numpy(), atol=1e-6)

    export, _ = runs("export", checkpoint, f"output={full / 'model.onnx'}", command="export")
    assert json.loads((export / "metrics.json").read_text())["max_abs_difference"] <= 1e-5
    import onnxruntime

    session = onnxruntime.InferenceSession(str(full / "model.onnx"), providers=["CPUExecutionProvider"])
    (exported,) = session.run(None, {"images": pixels.numpy()})  # raw uint8 pixels: normalization inside
    assert np.abs(exported - logits.numpy()).max() <= 1e-5
