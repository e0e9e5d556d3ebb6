"""The image machinery's tests run on its test task, :mod:`vision_task` (a small image classifier
over a folder of images), registered here for each test in place of the engine's regression; and
its data set, a synthetic folder of images."""

from pathlib import Path

import pytest
from vision_task.classifier import make_image_folder
from vision_task.task import TASK

from ddp_engine.api import register
from ddp_engine.config.schema import register_configs


@pytest.fixture(autouse=True)
def test_task():
    """The image test task, registered for each test (it replaces engine/tests/conftest.py's)."""
    register(TASK)
    register_configs()
    return TASK


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory) -> Path:
    """A folder of RGB PNGs, five classes (:func:`vision_task.classifier.make_image_folder`), with 5%
    of the labels moved to another class, so that the accuracy stays below 1."""
    return make_image_folder(tmp_path_factory.mktemp("images") / "colours", label_noise=0.05)
