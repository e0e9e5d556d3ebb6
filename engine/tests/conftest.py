"""The engine's own tests run on its test project, :mod:`sensor_task` (a regression on float
windows, no data files), registered with the engine for every test here: a test that composes a
config in its own process composes the test project's. The commands the tests start register it
themselves (``python -m sensor_task.train``).

Not registered when this file is imported: pytest imports the conftest of every test path before
it collects a test module, and the project's test modules (tests/) compose with the project's at
import."""

import pytest

from ddp_engine.api import register
from ddp_engine.config.schema import register_configs
from sensor_task.task import TASK


@pytest.fixture(autouse=True)
def test_task():
    """The test task, registered for each test: a pytest worker also runs the project's tests,
    whose conftest registers the project's own."""
    register(TASK)
    register_configs()  # the task's node and schemas in Hydra's ConfigStore, where tests compose
    return TASK
