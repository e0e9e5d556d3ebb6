"""The template's batch script (slurm/train.sbatch), as users submit it, runs its task's training.

SLURM cannot exist here: its ``srun`` is simulated by a script that starts the tasks with the
variables srun gives each task, on one node; everything after that (Lightning's SLURMEnvironment,
gloo, the run) is real. The engine's own launch tests (torchrun, srun) are in engine/tests/launch/.
"""

import json
import subprocess
import sys

import pytest
from helpers import REPO, simulated_slurm

pytestmark = pytest.mark.processes


def test_sbatch_script_runs_under_simulated_slurm(synthetic_data_dir, tmp_path):
    """The script's tasks get their ranks from SLURM, the port from the job id, one run named after
    the job and step."""
    # On CPU: the script's own knobs for CPU nodes; the rest is the script as users submit it.
    knobs = {"PYTHON": sys.executable, "ACCELERATOR": "cpu", "STRATEGY": "ddp", "DATA_DIR": str(synthetic_data_dir)}
    env = {**simulated_slurm(tmp_path / "bin", job_id="4242", ntasks=2), **knobs}
    overrides = [f"paths.log_dir={tmp_path / 'logs'}", "trainer.max_epochs=1", "data.val_size=200",
                 "data.global_batch_size=64", "+callbacks.ranks._target_=probes.RankRecorder",
                 "+callbacks.ranks.out_dir=${paths.output_dir}/ranks"]  # fmt: skip
    result = subprocess.run(
        ["bash", str(REPO / "slurm" / "train.sbatch"), *overrides],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    run = tmp_path / "logs" / "runs" / "slurm-4242.0"
    ranks = sorted((json.loads(p.read_text()) for p in (run / "ranks").iterdir()), key=lambda r: r["global_rank"])
    assert [(r["global_rank"], r["local_rank"], r["node_rank"], r["world_size"]) for r in ranks] == [
        (0, 0, 0, 2), (1, 1, 0, 2)
    ]  # fmt: skip
    # Lightning's SLURMEnvironment picked the rendezvous port from the job id: 15000 + its last 4 digits.
    assert json.loads((run / "ddp.json").read_text())["master_port"] == 15000 + 4242
    assert sorted(p.name for p in (run / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert json.loads((run / "metrics.json").read_text())["world_size"] == 2
