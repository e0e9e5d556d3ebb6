"""core.environment's launcher detection without Lightning agrees with Lightning's own."""

import pytest

from ddp_engine.core.environment import external_launcher, launched_externally

LAUNCHER_VARIABLES = ("TORCHELASTIC_RUN_ID", "RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_NTASKS", "SLURM_JOB_NAME")

ENVIRONMENTS = {
    "plain python": {},
    "the template's supervisor's worker": {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"},
    "torchrun": {"TORCHELASTIC_RUN_ID": "abc", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"},
    "srun": {"SLURM_NTASKS": "2", "SLURM_JOB_NAME": "train"},
    "srun, no job name": {"SLURM_NTASKS": "2"},
    "salloc's interactive shell": {"SLURM_NTASKS": "2", "SLURM_JOB_NAME": "interactive"},
    "an sbatch bash job": {"SLURM_NTASKS": "2", "SLURM_JOB_NAME": "bash"},
    "torchrun inside an interactive allocation": {
        "TORCHELASTIC_RUN_ID": "abc",
        "RANK": "0",
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NAME": "bash",
    },
}


@pytest.mark.parametrize("name", ENVIRONMENTS)
def test_launched_externally_answers_as_lightnings_detect_does(monkeypatch, name):
    for variable in LAUNCHER_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    for variable, value in ENVIRONMENTS[name].items():
        monkeypatch.setenv(variable, value)
    expected = name.startswith(("torchrun", "srun"))
    assert launched_externally() is expected
    assert (external_launcher() is not None) is expected, "Lightning's detect() says otherwise"
