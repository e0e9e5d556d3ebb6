"""A console whose reader has gone (``| head``) drops the output and the run goes on
(``ddp_engine.core.console``): on a real pipe in this process, and for a real training command
of the test task."""

import json
import logging
import os
import subprocess

import pytest
from harness import HERE, cli_command, cli_env
from runs import TRAIN

from ddp_engine.core.console import DropsWhenClosed

#: A test MSE below it: the run learnt (the targets' variance is about 3.6; one epoch reaches about 0.1).
MSE_LEARNT = 0.5


def test_a_closed_pipe_points_the_stream_at_devnull_and_says_so_once(caplog, monkeypatch):
    # Another test's logging config (a job's, Hydra's) may have turned this module's logger off.
    logger = logging.getLogger("ddp_engine.core.console")
    monkeypatch.setattr(logger, "disabled", False)
    monkeypatch.setattr(logger, "propagate", True)
    read_end, write_end = os.pipe()
    stream = DropsWhenClosed(os.fdopen(write_end, "w"))
    stream.write("read\n")
    stream.flush()
    assert os.read(read_end, 100) == b"read\n"  # an open reader gets the text as it was written
    assert not stream.closed_reader and os.readlink(f"/proc/self/fd/{write_end}").startswith("pipe:")
    os.close(read_end)  # the reader exits, as head does after its lines
    with caplog.at_level(logging.WARNING, logger="ddp_engine.core.console"):
        assert stream.write("lost\n") == len("lost\n")
        stream.flush()  # raised BrokenPipeError unguarded
        stream.writelines(["more\n", "and more\n"])
        stream.flush()
    assert stream.closed_reader
    assert os.readlink(f"/proc/self/fd/{write_end}") == os.devnull
    assert [record.getMessage().split(" (")[0] for record in caplog.records] == [
        "The reader of this process's console has gone"
    ]
    assert stream.fileno() == write_end and stream.isatty() is False  # the stream's own attributes
    stream.stream.close()


@pytest.mark.processes
def test_a_run_whose_console_reader_exits_trains_on_and_completes(sensor_data, tmp_path):
    # As `python -m sensor_task.train ... | head -1`: one line is read, then the pipe's reader is gone.
    # Unguarded, Rich's progress bar ended rank 0 (SystemExit(1)) and the job failed.
    command = cli_command(
        TRAIN, *sensor_data, "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_epochs=1", log_dir=tmp_path
    )
    with open(tmp_path / "stderr.txt", "w") as stderr:
        process = subprocess.Popen(command, cwd=HERE, env=cli_env(), stdout=subprocess.PIPE, stderr=stderr, text=True)
        first_line = process.stdout.readline()
        process.stdout.close()
        status = process.wait(timeout=600)
    errors = (tmp_path / "stderr.txt").read_text()
    assert status == 0, errors[-3000:]
    assert "Run directory" in first_line
    (run_dir,) = (tmp_path / "runs").iterdir()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "completed" and metrics["test/mse"] < MSE_LEARNT, metrics
    log = (run_dir / "train.log").read_text()
    # Rank 0 (its progress bar, its log lines) found the reader gone, said so in the log file, and
    # trained and tested on: the test's result is logged after that line.
    gone = log.index("[rank 0][ddp_engine.core.console][WARNING] - The reader of this process's stdout has gone")
    assert log.index("Results: val/mse", gone) > gone
    assert "Traceback" not in errors and "Logging error" not in errors, errors[-3000:]
