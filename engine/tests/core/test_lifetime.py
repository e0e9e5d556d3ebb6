"""How a command's process ends (``ddp_engine.core.lifetime.exit_without_teardown``): what a normal
exit does for the user is still done (non-daemon threads finish, ``atexit`` handlers run, buffered
output is written, the status is ``sys.exit``'s), what it does for the interpreter alone is skipped
(freeing every object: the finalizers of objects no handler holds do not run)."""

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.processes

PROGRAM = textwrap.dedent("""
    import atexit, sys, threading, time
    from ddp_engine.core.lifetime import exit_without_teardown

    class Teardown:
        def __del__(self):
            print("finalized", flush=True)

    def command():
        keep = Teardown()  # a module-level object: freed only by the interpreter's teardown
        sys.modules["__main__"].keep = keep
        atexit.register(print, "handler ran")
        def late():
            time.sleep(0.3)
            print("thread done")
        threading.Thread(target=late).start()
        sys.stdout.write("buffered, no newline")
        {end}

    exit_without_teardown(command)
""")


def run_program(end: str) -> subprocess.CompletedProcess:
    code = PROGRAM.replace("{end}", end)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("end", "status", "stderr"),
    [("return", 0, ""), ("sys.exit(3)", 3, ""), ("sys.exit('Error: refused')", 1, "Error: refused\n")],
)
def test_a_command_ends_with_its_threads_handlers_output_and_status_but_no_teardown(end, status, stderr):
    result = run_program(end)
    assert result.returncode == status, result.stderr
    # The thread finished before the handlers ran (the interpreter's order), the buffered text was
    # written, and the object that only the teardown frees was never finalized.
    assert result.stdout == "buffered, no newlinethread done\nhandler ran\n"
    assert result.stderr == stderr


def test_a_command_under_a_profiler_ends_normally_so_that_the_profiler_writes_its_results(tmp_path):
    code = tmp_path / "command.py"
    code.write_text(PROGRAM.replace("{end}", "return"))
    profile = tmp_path / "command.prof"
    command = [sys.executable, "-m", "cProfile", "-o", str(profile), str(code)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "handler ran" in result.stdout, result.stderr
    assert profile.stat().st_size > 0
    assert "finalized" in result.stdout  # the interpreter's own exit


def test_a_bug_keeps_its_traceback_and_the_normal_exit():
    result = run_program("raise RuntimeError('a bug')")
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "RuntimeError: a bug" in result.stderr
    assert "finalized" in result.stdout  # the interpreter's own exit, with its teardown


STARTING = textwrap.dedent("""
    import os, signal, sys
    from ddp_engine.core.lifetime import end_at_once_on_stop_signals, restore_stop_signals
    # As a terminal's shell starts a command (a test run started in the background ignores SIGINT),
    # or as it starts `command &` from a script.
    ignored = sys.argv[1] == "ignored"
    signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else signal.default_int_handler)
    end_at_once_on_stop_signals("while it starts")
    if sys.argv[1] == "restored":
        restore_stop_signals()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        signal.sigtimedwait([], 0.1)  # a moment for the handler to run
    except KeyboardInterrupt:
        print("KeyboardInterrupt")
    print("alive")
""")


@pytest.mark.parametrize(
    ("case", "status", "stdout", "stderr"),
    [
        ("default", 128 + 2, "", "Stopped by SIGINT while it starts.\n"),
        ("ignored", 0, "alive\n", ""),  # an ignored signal stays ignored
        ("restored", 0, "KeyboardInterrupt\nalive\n", ""),  # Python's own handler is back
    ],
)
def test_a_stop_signal_while_the_command_starts_ends_it_at_once_with_one_line(case, status, stdout, stderr):
    result = subprocess.run([sys.executable, "-c", STARTING, case], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (status, stdout, stderr)
