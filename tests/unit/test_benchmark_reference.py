"""The benchmark's hand-written reference builds the fast recipe's model with the same initial weights."""

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from benchmarks.reference_ddp import make_model
from mnist_ddp.cli.schema import CONFIG_DIR, register_configs


def test_reference_builds_the_fast_recipes_model_with_the_same_initial_weights():
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=fast"])
    torch.manual_seed(3)
    template = instantiate(cfg.model.net)
    torch.manual_seed(3)
    reference = make_model()
    template_params, reference_params = list(template.parameters()), list(reference.parameters())
    assert [p.shape for p in template_params] == [p.shape for p in reference_params]
    assert all(torch.equal(a, b) for a, b in zip(template_params, reference_params))
    template.eval(), reference.eval()
    images = torch.randn(5, 1, 28, 28)
    assert torch.equal(template(images), reference(images)), "same layers in the same order, dropout included"
