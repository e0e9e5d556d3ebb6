"""The value checks that run before torch and Lightning are imported (config/early_checks.py), each
held to what it stands in for: the optimizer rules to torch's own constructors, the CPU devices rule
to Lightning's own parser. (That the command line refuses with them before importing torch:
refusals/test_refusals_cli.py.)"""

import inspect
import math

import pytest
import torch
from lightning.fabric.accelerators import CPUAccelerator
from omegaconf import OmegaConf

from ddp_engine.config.early_checks import OPTIMIZER_RULES, check_optimizer, optimizer_rules
from ddp_engine.core.errors import ConfigValueError
from ddp_engine.distributed.layout_rules import check_devices, known_world_size, parse_cpu_devices

#: Values that probe each rule's bounds, NaN among them (refused by ``not 0 <= x``, passed by ``x < 0``).
PROBES = (-1, -0.5, -1e-12, 0, 0.0, 0.5, 0.999, 1, 1.0, 1.5, math.nan)


def early_refusal(node: dict) -> str | None:
    """The early check's message for the ``model.optimizer`` node ``node``; None where it passes."""
    try:
        check_optimizer(OmegaConf.create(node))
    except ConfigValueError as error:
        return str(error)
    return None


def torch_refusal(name: str, node: dict) -> str | None:
    """torch's own refusal of ``torch.optim.<name>(params, **arguments)``, as the later check words it."""
    arguments = {key: value for key, value in node.items() if key[0] != "_"}
    try:
        getattr(torch.optim, name)([torch.nn.Parameter(torch.zeros(1))], **arguments)
    except ValueError as error:
        given = ", ".join(f"model.optimizer.{key}={value}" for key, value in arguments.items())
        return f"model.optimizer: {error} (its arguments: {given})."
    return None


@pytest.mark.parametrize(
    ("name", "rule"), [(name, rule) for name, rules in OPTIMIZER_RULES.items() for rule in rules],
    ids=[f"{name}-{rule.argument}{'' if rule.index is None else rule.index}{'-pair' * rule.pair}"
         for name, rules in OPTIMIZER_RULES.items() for rule in rules],
)  # fmt: skip
def test_each_optimizer_rule_refuses_what_torch_refuses_in_its_words(name, rule):
    assert rule.argument in inspect.signature(getattr(torch.optim, name)).parameters
    # A pair (betas) is probed in each place, the other one valid.
    paired = rule.index is not None or rule.pair
    probes = [pair for value in PROBES for pair in ([value, 0.9], [0.9, value])] if paired else PROBES
    refused = 0
    for given in probes:
        node = {"_target_": f"torch.optim.{name}", "_partial_": True, rule.argument: given}
        assert early_refusal(node) == torch_refusal(name, node), f"{rule.argument}={given}"
        refused += early_refusal(node) is not None
    assert 0 < refused < len(probes), "the probes reach both sides of the rule"


def test_the_first_refused_argument_is_named_as_torch_names_it():
    # AdamW checks lr, eps, betas, weight_decay in that order: the first bad one is reported.
    node = {"_target_": "torch.optim.AdamW", "_partial_": True, "weight_decay": -1, "eps": -1, "lr": 0.1}
    assert early_refusal(node) == torch_refusal("AdamW", node)
    assert early_refusal(node).startswith("model.optimizer: Invalid epsilon value: -1 (its arguments: ")


def test_an_optimizer_torch_does_not_check_so_is_left_to_torch():
    assert optimizer_rules("torch.optim.adamw.AdamW") == OPTIMIZER_RULES["AdamW"]
    assert optimizer_rules("my_project.optim.AdamW") == optimizer_rules("torch.optim.LBFGS") == ()
    # A value that is not a number: torch's own check (later) words it.
    assert early_refusal({"_target_": "torch.optim.SGD", "lr": "fast", "momentum": -1}) is None


@pytest.mark.parametrize("devices", [0, -1, -2, 1, 2, "3", " 4 ", "0", "-1", "a", "auto", 1.5, [0, 1], True])
def test_the_cpu_devices_rule_is_lightnings(devices):
    try:
        expected = CPUAccelerator.parse_devices(devices)
    except TypeError:
        with pytest.raises(ConfigValueError, match=r"is not a positive process count on CPU\.$"):
            parse_cpu_devices(devices)
    else:
        assert parse_cpu_devices(devices) == expected


@pytest.mark.parametrize(
    ("accelerator", "devices", "refused"),
    [
        # What no accelerator runs: on CPU and by Lightning's GPU parser alike.
        *[(accelerator, devices, True) for accelerator in ("auto", "gpu")
          for devices in (0, "0", -2, 1.5, "a", [])],
        # What depends on this machine's GPUs is left to the later check.
        *[("auto", devices, False) for devices in (-1, "-1", 2, "2", "0,1", [0, 1], "auto")],
        ("cpu", -1, True), ("cpu", [0, 1], True), ("cpu", "auto", False), ("cpu", "2", False),
    ],
)  # fmt: skip
def test_devices_that_no_machine_runs_are_refused(accelerator, devices, refused):
    if refused:
        with pytest.raises(ConfigValueError, match=r"^trainer\.devices="):
            check_devices(accelerator, devices)
    else:
        check_devices(accelerator, devices)


@pytest.mark.parametrize(
    ("accelerator", "devices", "num_nodes", "world_size"),
    [("cpu", "auto", 1, 2), ("cpu", 3, 2, 6), ("gpu", [0, 1], 2, 4), ("auto", "4", 1, 4), ("auto", "auto", 1, None),
     ("gpu", -1, 1, None), ("gpu", "0,1", 1, None)],
)  # fmt: skip
def test_the_world_size_is_known_where_the_config_alone_tells_it(accelerator, devices, num_nodes, world_size):
    assert known_world_size(accelerator, devices, num_nodes) == world_size
