"""This task's guarantees on real DDP processes (ddp_engine.testing.TaskGuarantees), on whatever
its configs select: src/mnist_ddp/task.py's data and model, pointed at test data by the fixture
``task_overrides`` (conftest.py). A task of your own made the default gets them as they are."""

import pytest
from ddp_engine.api import TaskGuarantees

from mnist_ddp.task import TASK

pytestmark = [pytest.mark.task, pytest.mark.processes]


class TestTask(TaskGuarantees):
    """The engine's guarantees on this task."""

    task = TASK
