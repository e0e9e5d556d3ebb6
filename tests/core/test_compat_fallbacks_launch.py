"""Where a private API that the launch and the config check use (``ddp_engine.core.compat``) is
missing or changed, as a library release may leave it, the command still does its work, and the
log says once what it lost: each test removes or changes one, as the library would, then runs the
code that uses it (twice: the line comes once) and checks what it did instead.

Each runs in this process.
"""

import atexit
import logging
import multiprocessing
import os
import sys

import pytest
from ddp_engine.core import compat
from ddp_engine.core.lifetime import exit_without_teardown


@pytest.fixture
def lost(monkeypatch, caplog):
    """The private APIs that compat says are lost, in the order said (each line as often as said)."""
    monkeypatch.setattr(compat, "_LOST", set())
    monkeypatch.setattr(logging.getLogger(compat.__name__), "disabled", False)  # other tests' logging configs
    caplog.set_level(logging.WARNING, logger=compat.__name__)

    def said() -> list[str]:
        messages = [record.getMessage() for record in caplog.records if record.name == compat.__name__]
        return [message.split(" is missing or changed")[0] for message in messages]

    return said


# --- Python: the exit handlers -------------------------------


def test_without_atexits_run_exitfuncs_a_command_ends_through_the_normal_exit_which_runs_them(monkeypatch, lost):
    monkeypatch.delattr(atexit, "_run_exitfuncs")
    ended_without_teardown = []
    monkeypatch.setattr(os, "_exit", ended_without_teardown.append)  # recorded instead of ending pytest
    ran = []
    handler = lambda: ran.append("handler")  # noqa: E731
    atexit.register(handler)
    try:
        for command, status in ((lambda: None, 0), (lambda: sys.exit(3), 3)):
            with pytest.raises(SystemExit) as ended:
                exit_without_teardown(command)
            assert ended.value.code == status
    finally:
        atexit.unregister(handler)
    # Not os._exit, which would skip the handlers: the normal exit, which runs them (here: pytest's end).
    assert ended_without_teardown == [] and ran == []
    assert lost() == ["atexit._run_exitfuncs"]


def test_without_atexits_run_exitfuncs_a_worker_completes_its_job(monkeypatch, lost):
    # ddp_engine.launch.worker.run, as torch's agent runs it in a rank forked from the forkserver,
    # less what would change this process: its signals, its parent's watch, its title.
    from ddp_engine.launch import forkserver_preload, worker
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    monkeypatch.delattr(atexit, "_run_exitfuncs")
    monkeypatch.setattr(forkserver_preload, "FORKSERVER_PID", -1)  # forked from the forkserver
    for name in ("end_quietly_on_stop_signals", "end_with_parent", "drop_output_when_closed"):
        monkeypatch.setattr(worker, name, lambda *args: None)
    monkeypatch.setattr("setproctitle.setproctitle", lambda title: None)
    monkeypatch.setattr(rank_zero_only, "rank", rank_zero_only.rank)  # restored after
    monkeypatch.setenv("RANK", "0")
    ran = []
    monkeypatch.setattr(worker, "main", ran.append)
    start_method = multiprocessing.get_start_method(allow_none=True)
    try:
        worker.run("job.yaml", dict(os.environ))
        worker.run("job.yaml", dict(os.environ))
    finally:
        multiprocessing.set_start_method(start_method, force=True)
    assert ran == ["job.yaml", "job.yaml"]
    assert lost() == ["atexit._run_exitfuncs"]
