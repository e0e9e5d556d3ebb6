"""The formats ``python -m <package>.export`` writes (the schema's ``format``) and the file each
writes, apart from the exporter (:mod:`ddp_engine.vision.export`) so that the schema reads them, and
the command checks the output and the format's packages, without importing torch (seconds)."""

import importlib.util
from enum import Enum
from pathlib import Path
from typing import Any

from ddp_engine.api import ConfigValueError, ExportError, check_writable


class ExportFormat(str, Enum):
    """``format`` of ``python -m <package>.export`` (:mod:`ddp_engine.vision.export`): ``onnx``, an
    ONNX model (``<checkpoint stem>.onnx``), or ``torch_export``, a ``torch.export`` program
    (``<checkpoint stem>.pt2``)."""

    onnx = "onnx"
    torch_export = "torch_export"


#: The file name suffix of each format, for the default output beside the checkpoint.
SUFFIXES = {ExportFormat.onnx: ".onnx", ExportFormat.torch_export: ".pt2"}
#: The packages each format needs beyond the project's own dependencies: the ``export`` extra.
PACKAGES = {ExportFormat.onnx: ("onnx", "onnxruntime", "onnxscript"), ExportFormat.torch_export: ()}


def output_path(ckpt_path: str, export_format: ExportFormat, output: str | None) -> Path:
    """Where the exported file goes: ``output`` when given, else beside the checkpoint, its name with
    the format's suffix (:data:`SUFFIXES`)."""
    return Path(output) if output is not None else Path(ckpt_path).with_suffix(SUFFIXES[export_format])


def check_exporter(export_format: ExportFormat) -> None:
    """Refuse a format whose packages (:data:`PACKAGES`, the ``export`` extra) are not installed,
    found without importing them.

    Raises:
        ExportError: naming the missing packages and the extra that installs them.
    """
    if missing := [name for name in PACKAGES[export_format] if importlib.util.find_spec(name) is None]:
        raise ExportError(
            f"format={export_format.value} needs the packages {', '.join(PACKAGES[export_format])}, and "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed: "
            f"pip install {' '.join(PACKAGES[export_format])} (or format=torch_export, which needs nothing more)."
        )


def check_export_paths(cfg: Any) -> None:
    """``task.export.check_paths`` of the image classifier, before torch is imported: a ``format``
    it writes, whose packages are installed (:func:`check_exporter`), and an ``output`` that does not
    exist yet (:func:`check_output`).

    Raises:
        ConfigValueError, ExportError: naming the value and what is allowed.
    """
    try:
        export_format = ExportFormat(cfg.format)
    except ValueError:
        formats = ", ".join(value.value for value in ExportFormat)
        raise ConfigValueError(f"format={cfg.format}: the export writes {formats}.") from None
    check_exporter(export_format)
    check_output(output_path(cfg.ckpt_path, export_format, cfg.output))


def check_export_job(cfg: Any, model: Any, world_size: int) -> None:
    """``task.export.check_job`` of the image classifier: the output's folder is writable (a file made
    and removed there)."""
    folder = output_path(cfg.ckpt_path, ExportFormat(cfg.format), cfg.output).parent
    check_writable("output", folder)


def check_output(path: Path) -> None:
    """Refuse an output path that exists: an export never replaces a file.

    Raises:
        ConfigValueError: naming it and the ways on.
    """
    if path.exists() or path.is_symlink():
        raise ConfigValueError(
            f"output={path} exists, and an export never overwrites a file. Give another output=<file>, "
            "or move that one away first."
        )
