"""A run folder from elsewhere builds only what the project trusts: every ``_target_`` of its saved
config and overrides is checked before it is imported or built (:mod:`ddp_engine.config.trust`).

Each planted target below would leave a marker file if it ran; the refusal names the target, the
file and its line, and the marker is absent. The fix the message names (``trusted_targets=[...]``)
lets a trusted folder's own class through.
"""

import json
import pickle
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from harness import only, run_cli
from runs import TRAIN

EVAL = "sensor_task.eval"


pytestmark = pytest.mark.processes


class Payload:
    """Unpickled, it touches ``marker``: what a pickle planted in a run folder can do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return subprocess.call, (["touch", str(self.marker)],)


@pytest.fixture
def folder(sensor_run, tmp_path) -> Path:
    """A copy of a finished run of the test task, as a user receives one."""
    log_dir, _ = sensor_run
    copy = tmp_path / "shared" / "run"
    shutil.copytree(only(log_dir / "runs"), copy)
    return copy


def plant(folder: Path, key: str, node: dict) -> None:
    """Set ``key`` (dotted) of the folder's saved config to ``node``, as an edit of the file would."""
    path = folder / ".hydra" / "config.yaml"
    config = yaml.safe_load(path.read_text())
    *parents, name = key.split(".")
    parent = config
    for part in parents:
        parent = parent.setdefault(part, {})
    parent[name] = node
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def line_of(path: Path, text: str) -> int:
    return next(number for number, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def evaluate(folder: Path, *overrides: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    """``eval`` of the folder's best checkpoint, the folder on PYTHONPATH when ``pythonpath`` (as
    for a user whose current directory it is)."""
    env = {"PYTHONPATH": f"{pythonpath}"} if pythonpath else None
    checkpoint = folder / "checkpoints" / Path(json.loads((folder / "metrics.json").read_text())["checkpoint"]).name
    return run_cli(EVAL, f"ckpt_path={checkpoint}", "trainer.accelerator=cpu", "trainer.devices=1", *overrides,
                   log_dir=folder.parent / "evals", env=env)  # fmt: skip


def planted_targets(folder: Path, marker: Path) -> dict[str, tuple[str, dict]]:
    """The planted nodes, by what they try: (the key they replace, the node)."""
    (folder / "payload.pkl").write_bytes(pickle.dumps(Payload(marker)))
    (folder / "folder_module.py").write_text(f"open({str(marker)!r}, 'w').close()\nNet = object\n")
    return {
        "runs a process": ("model.net", {"_target_": "subprocess.call", "args": ["touch", str(marker)]}),
        "imports a module of the folder": ("model.net", {"_target_": "folder_module.Net"}),
        "unpickles a file of the folder": (
            "model.net", {"_target_": "torch.load", "f": str(folder / "payload.pkl"), "weights_only": False}),
        "reaches torch.load through a trusted module": (
            "model.net", {"_target_": "torch.nn.functional.torch.load", "f": str(folder / "payload.pkl"),
                          "weights_only": False}),
        "runs a process from a task callback": (
            "task.callbacks.planted", {"_target_": "os.system", "command": f"touch {marker}"}),
    }  # fmt: skip


@pytest.mark.parametrize("attempt", [
    "runs a process", "imports a module of the folder", "unpickles a file of the folder",
    "reaches torch.load through a trusted module", "runs a process from a task callback",
])  # fmt: skip
def test_eval_of_a_folder_with_a_planted_target_refuses_it_and_runs_nothing(folder, tmp_path, attempt):
    marker = tmp_path / "ran"
    key, node = planted_targets(folder, marker)[attempt]
    plant(folder, key, node)
    config = folder / ".hydra" / "config.yaml"
    result = evaluate(folder, pythonpath=folder)

    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    target = node["_target_"]
    assert f"{config}:{line_of(config, f'_target_: {target}')}: _target_: {target}" in line
    assert f"'trusted_targets=[{target}]'" in line
    assert not marker.exists(), f"{attempt}: the planted target ran"
    assert not (folder.parent / "evals").exists(), "refused before a run directory was made"


def test_a_target_the_user_trusts_for_one_command_is_built(folder):
    """The refusal's fix: the folder's own network, allowed by ``trusted_targets``, evaluates as the run's."""
    (folder / "folder_nets.py").write_text("from sensor_task.regression import SensorNet as Net\n")
    config = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
    plant(folder, "model.net", {**config["model"]["net"], "_target_": "folder_nets.Net"})

    refused = evaluate(folder, pythonpath=folder)
    assert refused.returncode == 1 and "'trusted_targets=[folder_nets.Net]'" in refused.stderr, refused.stderr[-2000:]
    result = evaluate(folder, "trusted_targets=[folder_nets.Net]", pythonpath=folder)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    evaluated = json.loads((only(folder.parent / "evals" / "evals") / "metrics.json").read_text())
    trained = json.loads((folder / "metrics.json").read_text())
    assert evaluated["test/mse"] == pytest.approx(trained["test/mse"], rel=1e-6), "the run's network and weights"


@pytest.mark.parametrize("planted", [
    "+hydra.job.env_set.PLANTED=1",
    "model=../../../planted",
    "model.net._target_=subprocess.call",
    "+task.callbacks.planted={_target_: os.system, command: touch}",
])  # fmt: skip
def test_a_resume_in_place_refuses_a_planted_override_before_anything_runs(folder, planted):
    overrides = folder / ".hydra" / "overrides.yaml"
    saved = yaml.safe_load(overrides.read_text())
    overrides.write_text(yaml.safe_dump([*saved, planted]))
    before = {path: path.stat().st_mtime_ns for path in [folder / "train.log", *(folder / "checkpoints").iterdir()]}
    result = run_cli(TRAIN, f"hydra.run.dir={folder}", "ckpt_path=last", "trainer.max_epochs=3",
                     log_dir=folder.parent / "logs")  # fmt: skip

    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert f"{overrides}:{len(saved) + 1}: " in line and planted.split("=")[0].lstrip("+") in line
    after = {path: path.stat().st_mtime_ns for path in [folder / "train.log", *(folder / "checkpoints").iterdir()]}
    assert after == before, "nothing started: the run's log and checkpoints are as they were"


def test_a_trust_saved_in_a_run_is_not_carried_on(folder):
    """``trusted_targets`` in a folder's overrides trusts nothing: it is read from the command line only."""
    overrides = folder / ".hydra" / "overrides.yaml"
    overrides.write_text(yaml.safe_dump([*yaml.safe_load(overrides.read_text()), "trusted_targets=[subprocess]"]))
    plant(folder, "model.net", {"_target_": "subprocess.call", "args": ["true"]})
    result = evaluate(folder)
    assert result.returncode == 1 and "'trusted_targets=[subprocess.call]'" in result.stderr, result.stderr[-2000:]
