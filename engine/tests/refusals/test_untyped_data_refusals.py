"""A task's data without a schema of its own (the regression's) is refused as typed data is: a missing
file its DataModule's prepare_data reports, and an engine key of the wrong type, are each one line
before launch, naming the method or the key, not a traceback."""

import pytest

from ddp_engine.config.command_line import check_command_line
from ddp_engine.core.errors import UsageError

LAUNCH = ("trainer.accelerator=cpu", "trainer.devices=2")


def test_a_missing_data_file_is_one_line_naming_the_datamodules_method(tmp_path):
    with pytest.raises(UsageError) as refused:
        check_command_line("config", [f"data.path={tmp_path / 'gone.npz'}", *LAUNCH])
    assert str(refused.value) == (
        f"data: SensorDataModule.prepare_data() failed: FileNotFoundError: data.path={tmp_path / 'gone.npz'} "
        "is not a file"
    )


def test_an_engine_data_key_of_the_wrong_type_is_one_line_naming_it(windows):
    with pytest.raises(UsageError) as refused:
        check_command_line("config", [f"data.path={windows}", "data.global_batch_size=big", *LAUNCH])
    assert str(refused.value) == "data.global_batch_size=big must be a whole number of samples (at least 1)."
