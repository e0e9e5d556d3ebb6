"""The MNIST task's predict and export, through its real command lines: its Task declares the image
machinery's (``ddp_engine.vision``; their every case is the engine's: engine/tests/vision/), and a
checkpoint of its CNN, made in this process, predicts an IDX file's digits on 2 gloo processes,
one row each, and exports to ONNX a file that computes the checkpoint's probabilities."""

import csv
import json

import numpy as np
import onnxruntime
import pytest
import torch
from ddp_engine.vision.idx import IMAGES_KIND, MNIST_FILES, read_idx_file
from ddp_engine.vision.spec import read_data_spec
from harness import only
from helpers import run_cli

from mnist_ddp.model import MNISTClassifier
from mnist_ddp.networks import CNN

pytestmark = pytest.mark.processes

LAUNCH = ("trainer.accelerator=cpu", "trainer.devices=2")


def probabilities(checkpoint, pixels: torch.Tensor) -> torch.Tensor:
    """``(N, 10)`` class probabilities of ``checkpoint``'s CNN on ``(N, 28, 28)`` uint8 digits, here."""
    spec = read_data_spec(checkpoint)
    net = CNN(**spec.network_arguments())
    model = MNISTClassifier(net, optimizer=None, scheduler=None, data_spec=spec)
    model.load_state_dict(torch.load(checkpoint, weights_only=True)["state_dict"])
    with torch.no_grad():
        return model.eval()(spec.normalize(pixels.unsqueeze(1))).softmax(dim=1)


def test_a_checkpoint_predicts_an_idx_file_and_exports_to_onnx(checkpoint, synthetic_data_dir, tmp_path):
    images = synthetic_data_dir / "MNIST" / "raw" / MNIST_FILES["test_images"]
    pixels = read_idx_file(images, 3, IMAGES_KIND)
    expected = probabilities(checkpoint, pixels)

    predicted = run_cli(f"ckpt_path={checkpoint}", f"input={images}", *LAUNCH, module="mnist_ddp.predict",
                        log_dir=tmp_path)  # fmt: skip
    assert predicted.returncode == 0, predicted.stdout[-3000:] + predicted.stderr[-3000:]
    with open(only(tmp_path / "predictions") / "predictions.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [row["input"] for row in rows] == [str(index) for index in range(len(pixels))]
    assert [int(row["class_index"]) for row in rows] == expected.argmax(dim=1).tolist()
    assert [row["class_name"] for row in rows] == [str(index) for index in expected.argmax(dim=1).tolist()]
    assert [float(row["probability"]) for row in rows] == pytest.approx(expected.max(dim=1).values.tolist(), abs=1e-6)

    # The checkpoint's run left no config: the export checks its file on the command's data set's test images.
    exported = run_cli(f"ckpt_path={checkpoint}", "format=onnx", f"output={tmp_path / 'cnn.onnx'}",
                       f"data.data_dir={synthetic_data_dir}", module="mnist_ddp.export", log_dir=tmp_path)  # fmt: skip
    assert exported.returncode == 0, exported.stdout[-3000:] + exported.stderr[-3000:]
    assert json.loads((only(tmp_path / "exports") / "metrics.json").read_text())["output"] == str(tmp_path / "cnn.onnx")
    session = onnxruntime.InferenceSession(str(tmp_path / "cnn.onnx"))
    (name,) = [entry.name for entry in session.get_inputs()]
    (output,) = session.run(None, {name: pixels[:16].unsqueeze(1).numpy()})
    assert np.allclose(torch.tensor(output).softmax(dim=1).numpy(), expected[:16].numpy(), atol=1e-5)
