"""The formats ``python -m mnist_ddp.export`` writes (the schema's ``format``), apart from the
exporter (:mod:`mnist_ddp.run.export`) so that the schema reads them without importing torch."""

from enum import Enum


class ExportFormat(str, Enum):
    """``format`` of ``python -m mnist_ddp.export`` (:mod:`mnist_ddp.run.export`): ``onnx``, an
    ONNX model (``<checkpoint stem>.onnx``), or ``torch_export``, a ``torch.export`` program
    (``<checkpoint stem>.pt2``)."""

    onnx = "onnx"
    torch_export = "torch_export"
