"""The guarantees suite that a task's tests subclass (ddp_engine.testing.TaskGuarantees) runs on a
task that is not image classification: the test task's regression, its data pointed at by the
fixture ``task_overrides`` as a task's conftest.py gives it."""

import pytest

from ddp_engine.api import TaskGuarantees
from sensor_task.task import TASK

pytestmark = pytest.mark.processes


@pytest.fixture(scope="session")
def task_overrides(sensor_data) -> list[str]:
    return sensor_data


class TestRegression(TaskGuarantees):
    """The engine's guarantees on the regression."""

    task = TASK
