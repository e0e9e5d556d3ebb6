"""Export: what ``python -m <package>.export`` does, in one process.

:func:`export_checkpoint` writes the network of a checkpoint, with the normalization of its
training run inside, to a file that runs without this project: an ONNX model (``format=onnx``,
for onnxruntime and other ONNX runtimes) or a ``torch.export`` program (``format=torch_export``,
loaded with ``torch.export.load``). By default the file goes beside the checkpoint, named after it
(``epoch_002.ckpt`` -> ``epoch_002.onnx`` / ``epoch_002.pt2``); ``output=<file>`` puts it elsewhere.

The exported model's contract (:class:`PixelClassifier`), from the data set the checkpoint was
trained on (its :class:`~ddp_engine.vision.spec.DataSpec`):

- input ``images``: ``(N, C, H, W)`` uint8 pixel values 0..255 of the data set's image shape, as
  its files hold them (MNIST: ``(N, 1, 28, 28)``, a white digit on black), for any batch size
  ``N`` (a dynamic dimension);
- output ``logits``: ``(N, num_classes)`` float32; softmax gives the class probabilities, argmax
  the class, whose name is ``class_names[i]`` (also in the file's metadata: ONNX
  ``metadata_props``, a ``torch.export`` extra file, both :data:`CLASS_NAMES_KEY`).

The data set's per-channel normalization, ``(pixel / 255 - mean[c]) / std[c]``, is computed inside
the exported graph, so a consumer feeds raw pixels and needs nothing else from the run. The model
is the checkpoint's run's, as for evaluation (applied before: :mod:`ddp_engine.config.saved_run`).

The file is written under a temporary name beside its final path, loaded back (onnxruntime for
ONNX, ``torch.export.load``) and run on :data:`CHECK_IMAGES` of the data set's test images; only when
its logits equal the LightningModule's on them within :data:`TOLERANCE` is it given its name, and
never over an existing file (:func:`ddp_engine.core.files.atomic_path`). A run directory
(``logs/exports/<stamp>/``) keeps the command's config, its log and ``metrics.json`` (the file,
the format, the difference found).
"""

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import Tensor, nn

from ddp_engine.api import ExportError, atomic_path, build_model
from ddp_engine.vision.classification import first_pixels
from ddp_engine.vision.export_format import SUFFIXES, ExportFormat, check_output, output_path
from ddp_engine.vision.spec import DataSpec, checkpoint_data_spec, normalize_pixels

log = logging.getLogger(__name__)

#: How many of the data set's test images the exported file is checked on.
CHECK_IMAGES = 64
#: The largest absolute difference between the file's logits and the LightningModule's it accepts.
TOLERANCE = 1e-5
#: The names of the graph's input and output.
INPUT_NAME, OUTPUT_NAME = "images", "logits"
#: The metadata key (ONNX) or extra file name (``torch.export``) of the class names, a JSON list.
CLASS_NAMES_KEY = "class_names"


class PixelClassifier(nn.Module):
    """A network with its data set's normalization in front: what is exported.

    Shapes: ``(N, C, H, W)`` uint8 pixel values 0..255 -> normalized ``(N, C, H, W)`` float32,
    ``(pixel / 255 - mean[c]) / std[c]`` (:func:`~ddp_engine.vision.spec.normalize_pixels`, the training
    images' own formula) -> ``net`` -> ``(N, num_classes)`` float32 logits.

    Args:
        net: the network (:mod:`ddp_engine.vision.networks`), in eval mode for export.
        spec: the data set it was trained on (its statistics become the graph's constants).
    """

    def __init__(self, net: nn.Module, spec: DataSpec) -> None:
        super().__init__()
        self.net = net
        mean, std = spec.statistics()
        self.register_buffer("mean", mean.clone())
        self.register_buffer("std", std.clone())

    def forward(self, images: Tensor) -> Tensor:
        """``(N, C, H, W)`` uint8 pixels -> ``(N, num_classes)`` float32 logits."""
        return self.net(normalize_pixels(images, self.mean, self.std))


def export_model(
    model: PixelClassifier, export_format: ExportFormat, path: Path, example: Tensor, class_names: Sequence[str]
) -> None:
    """Write ``model`` to ``path`` in ``export_format`` (overwriting ``path``: :func:`export_checkpoint`
    passes a temporary file), with a dynamic batch dimension and the class names as metadata.

    Args:
        model: what is exported, in eval mode.
        export_format: ``onnx`` (``torch.onnx.export``, the dynamo exporter; one file, weights
            inside) or ``torch_export`` (``torch.export.export`` and ``torch.export.save``).
        path: the file to write.
        example: ``(B, C, H, W)`` uint8 images that the export traces the model on.
        class_names: one per logit, stored in the file (:data:`CLASS_NAMES_KEY`).
    """
    batch = torch.export.Dim("batch")
    dynamic_shapes = {INPUT_NAME: {0: batch}}
    names = json.dumps(list(class_names))
    if export_format is ExportFormat.onnx:
        # The exporter's graph passes log every step at INFO, which would fill the job's log.
        for name in ("onnxscript", "onnx_ir"):
            logging.getLogger(name).setLevel(logging.WARNING)
        program = torch.onnx.export(
            model, (example,), input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
            dynamic_shapes=dynamic_shapes, dynamo=True, verbose=False,
        )  # fmt: skip
        program.model.metadata_props[CLASS_NAMES_KEY] = names
        program.save(path, external_data=False)  # one self-contained file (the weights are small)
    else:
        program = torch.export.export(model, (example,), dynamic_shapes=dynamic_shapes)
        # Through a file object: named by its path, the archive's folder would take the path's name.
        with open(path, "wb") as file:
            torch.export.save(program, file, extra_files={CLASS_NAMES_KEY: names})


def load_exported(export_format: ExportFormat, path: Path) -> Callable[[Tensor], Tensor]:
    """Load an exported file back as the consumer would.

    Returns:
        A function of ``(N, C, H, W)`` uint8 images to its ``(N, num_classes)`` float32 logits (on CPU):
        an onnxruntime session (CPU execution provider), or the ``torch.export`` program's module.
    """
    if export_format is ExportFormat.onnx:
        import onnxruntime  # the export extra: check_exporter has checked it is installed

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return lambda images: torch.from_numpy(session.run([OUTPUT_NAME], {INPUT_NAME: images.numpy()})[0])
    module = torch.export.load(path).module()
    return lambda images: module(images).detach()


def check_exported(export_format: ExportFormat, path: Path, images: Tensor, expected: Tensor) -> float:
    """Load the exported file and compare its logits on ``images`` with ``expected``.

    Args:
        export_format: the file's format.
        path: the file.
        images: ``(N, C, H, W)`` uint8 images.
        expected: ``(N, num_classes)`` float32 logits of the LightningModule on the same images, normalized
            as in training.

    Returns:
        The largest absolute difference, at most :data:`TOLERANCE`.

    Raises:
        ExportError: when it is larger, naming it.
    """
    with torch.no_grad():
        difference = (load_exported(export_format, path)(images) - expected).abs().max().item()
    if not difference <= TOLERANCE:  # written so that a NaN fails too
        raise ExportError(
            f"the exported {export_format.value} model computes other logits than the checkpoint's model: max "
            f"|difference| {difference:.3g} on {len(images)} test images (at most {TOLERANCE:g} allowed). Try the "
            "other format, or another torch / onnxruntime version."
        )
    return difference


def export_checkpoint(cfg: DictConfig) -> dict:
    """Export the checkpoint ``cfg.ckpt_path`` in ``cfg.format`` (see the module's docstring), check
    the file, and write ``metrics.json`` into the run directory.

    Returns:
        ``output`` (the file), ``format``, ``checkpoint``, ``max_abs_difference`` (of its logits
        from the LightningModule's) and ``check_images`` (how many test images were compared).

    Raises:
        ExportError: when the file's logits differ by more than :data:`TOLERANCE`; then nothing is
            written (the temporary file is removed).
        ConfigValueError: when the output file appeared since the command line was checked.
    """
    checkpoint = Path(cfg.ckpt_path).resolve()
    export_format = ExportFormat(cfg.format)
    output = output_path(cfg.ckpt_path, export_format, cfg.output).resolve()
    spec = checkpoint_data_spec(checkpoint, cfg.data)
    module = build_model(cfg.model, spec)
    # weights_only: tensors and plain values only, so that a checkpoint cannot run code when loaded.
    module.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"])
    module.eval()
    datamodule = instantiate(cfg.data)
    datamodule.setup("test")
    # A copy (first_pixels): a view would carry the whole test set into the torch.export file's example inputs.
    images = first_pixels(datamodule.test_set, CHECK_IMAGES)
    with torch.no_grad():
        expected = module(spec.normalize(images))
    # Checked while hidden, published only whole and never over a file created meanwhile
    # (atomic_path), with the format's suffix, which torch.export.load wants.
    try:
        with atomic_path(output, suffix=SUFFIXES[export_format], replace=False) as temporary:
            exported = PixelClassifier(module.net, spec).eval()
            export_model(exported, export_format, temporary, images, spec.class_names)
            difference = check_exported(export_format, temporary, images, expected)
    except FileExistsError:
        check_output(output)  # raises, naming it
        raise
    metrics = {
        "output": str(output), "format": export_format.value, "checkpoint": str(checkpoint),
        "max_abs_difference": difference, "check_images": len(images),
    }  # fmt: skip
    log.info(
        f"Exported {checkpoint} to {output} (format={export_format.value}): its logits on {len(images)} test images "
        f"differ from the checkpoint's model by at most {difference:.2g}"
    )
    return metrics
