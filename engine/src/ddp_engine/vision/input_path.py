"""The path of ``python -m <package>.predict``'s inputs (``input=``), checked without torch: the
command refuses a path that names nothing before it imports torch and Lightning (seconds), and
:func:`ddp_engine.vision.inputs.list_inputs` then reads what it names."""

from pathlib import Path
from typing import Any

from ddp_engine.api import DataNotAvailableError


def check_predict_paths(cfg: Any) -> None:
    """``task.predict.check_paths`` of the image classifier: :func:`check_input_path` of ``cfg.input``."""
    check_input_path(cfg.input)


def check_input_path(path: str | Path) -> None:
    """Refuse an ``input`` that names no file or folder.

    Raises:
        DataNotAvailableError: when ``path`` does not exist.
    """
    if not Path(path).exists():
        raise DataNotAvailableError(
            f"input={path}: no such file or folder. Pass a folder of PNG or JPEG images, or an IDX images file."
        )
