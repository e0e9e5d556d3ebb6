"""A ShardedDataModule with DataLoader workers starts its loaders' forkserver when the engine asks it
to (``start_loader_forkserver``: as soon as the DDP process has built it, before any loader), and the
forkserver imports torch and the datasets' modules only, not the DataModule's module nor Lightning,
whose import would delay the first batch by seconds; without workers, nothing starts."""

import ast
import json
import re
import subprocess
import sys

import pytest
from harness import cli_env

pytestmark = pytest.mark.processes

#: A DataModule of GatherDatasets in a module of its own (``__main__``), asked to start its forkserver;
#: it prints the command lines of its child processes once each has exec'd its own: Python's forkserver
#: (its preload list in its command line) and, with it, Python's resource tracker.
PROGRAM = """
import json, os, subprocess, sys, time
from ddp_engine.data.sharded import ShardedDataModule
class Squares(ShardedDataModule):
    pass
Squares(global_batch_size=8, num_workers=int(sys.argv[1])).start_loader_forkserver()
deadline = time.monotonic() + 60
while True:  # a child shows this program's command line until it has exec'd its own
    ps = subprocess.run(["ps", "-o", "args=", "--ppid", str(os.getpid())], capture_output=True, text=True)
    children = [line for line in ps.stdout.splitlines() if "ps -o" not in line]
    if not any("start_loader_forkserver" in child for child in children) or time.monotonic() > deadline:
        break
    time.sleep(0.05)
print(json.dumps(children))
"""


def forkserver_preloads(num_workers: int) -> list[list[str]]:
    """The preload list of each forkserver the program started with ``data.num_workers=num_workers``."""
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(num_workers)], capture_output=True, text=True,
                          env=cli_env(), timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    commands = json.loads(done.stdout)
    servers = [command for command in commands if "multiprocessing.forkserver import main" in command]
    return [ast.literal_eval(re.search(r"main\(\d+, \d+, (\[[^]]*\])", server)[1]) for server in servers]


def test_the_loaders_forkserver_starts_when_asked_and_imports_torch_and_the_datasets_only():
    assert forkserver_preloads(2) == [["ddp_engine.data.loader_forkserver", "ddp_engine.data.gather"]]
    assert forkserver_preloads(0) == [], "no workers, no forkserver"
