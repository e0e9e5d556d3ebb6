"""The benchmarks' parts that need no training run: the hand-written reference builds the fast
recipe's model with the same initial weights; the per-step harness refuses counts that leave no
timed step."""

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from benchmarks import per_step
from benchmarks.reference_ddp import make_model
from mnist_ddp.config.schema import CONFIG_DIR, register_configs


def test_reference_builds_the_fast_recipes_model_with_the_same_initial_weights():
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=fast"])
    torch.manual_seed(3)
    template = instantiate(cfg.model.net, 1, [28, 28], 10)  # MNIST's channels, size and classes
    torch.manual_seed(3)
    reference = make_model()
    template_params, reference_params = list(template.parameters()), list(reference.parameters())
    assert [p.shape for p in template_params] == [p.shape for p in reference_params]
    assert all(torch.equal(a, b) for a, b in zip(template_params, reference_params))
    template.eval(), reference.eval()
    images = torch.randn(5, 1, 28, 28)
    assert torch.equal(template(images), reference(images)), "same layers in the same order, dropout included"


@pytest.mark.parametrize(
    ("flag", "value", "least"), [("--steps", "0", 1), ("--warmup", "-1", 0), ("--repeats", "0", 1)]
)
def test_per_step_refuses_counts_that_leave_no_timed_step(flag, value, least, capsys):
    # A negative warm-up would index the timer's batch starts from the end: a wrong figure, not an error.
    with pytest.raises(SystemExit) as refused:
        per_step.main([flag, value])
    assert refused.value.code == 2
    assert f"{flag} {value}: at least {least}" in capsys.readouterr().err
