"""One place per default: ``conf/`` holds every value the command line need not give, and the
classes its data sets, models and task build take no default or the one the config gives.

(The engine's schema, and its own groups against its classes: engine/tests/config/test_engine_defaults.py.)
"""

import inspect
from enum import Enum

import pytest
from ddp_engine.config.compose import group_options, missing_values
from ddp_engine.config.saved_run import loading_keys
from ddp_engine.config.schema import register_configs
from helpers import CONFIG_DIR
from hydra import compose, initialize_config_dir
from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig, OmegaConf

register_configs()


def options_of(group: str) -> list[str]:
    """The options of ``group`` in the project's conf/ and the engine's, as the command line offers them."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return group_options(group)


#: Each entry point's config, with the keys its command line must set.
REQUIRED = {"config": [], "eval": ["ckpt_path"], "predict": ["ckpt_path", "input"], "export": ["ckpt_path"]}


@pytest.mark.parametrize("config_name", list(REQUIRED))
def test_the_default_configs_set_every_key(config_name):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name)
    assert missing_values(cfg) == REQUIRED[config_name]


def targets(node, path="") -> list[tuple[str, DictConfig]]:
    """Every ``(dotted path, node)`` under ``node`` whose ``_target_`` is a class of the project or the engine."""
    found = []
    if isinstance(node, DictConfig) and not node._is_none():  # None: a logger not selected
        target = node._get_node("_target_")._value() if "_target_" in node else None
        if isinstance(target, str) and target.startswith(("mnist_ddp.", "ddp_engine.")):
            found.append((path, node))
        for key in node:
            found += targets(node._get_node(key), f"{path}.{key}".lstrip("."))
    return found


def plain(value):
    """A signature default or a config value, compared as the YAML would write it."""
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=False)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value.value if isinstance(value, Enum) else value


CHOICES = [("config", f"{group}={option}") for group in ("data", "model") for option in options_of(group)]
CHOICES += [(config_name, "") for config_name in REQUIRED]


@pytest.mark.parametrize(("config_name", "choice"), CHOICES, ids=[f"{c}:{o or 'defaults'}" for c, o in CHOICES])
def test_class_defaults_are_the_configs_values(config_name, choice):
    overrides = [f"{key}=x" for key in REQUIRED[config_name]]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name, overrides=[*overrides, *([choice] if choice else [])])
    checked, differ = 0, []
    for path, node in targets(cfg):
        if path.split(".")[0] not in ("data", "model", "task"):
            continue  # the engine's groups, whose values are the engine's configs'
        for name, parameter in inspect.signature(get_object(node._target_)).parameters.items():
            if parameter.default is inspect.Parameter.empty or name not in node:
                continue
            # A data set of its own (data=fashion_mnist) differs from the default data set's
            # class defaults (MNIST's) by what makes it another data set.
            if path == "data" and name not in loading_keys(node) and choice in ("data=fashion_mnist", "data=idx"):
                continue
            value = node._get_node(name)
            if isinstance(value._value(), str) and value._value().startswith("${"):
                continue  # an interpolation (${seed}): its value is another key's
            checked += 1
            if plain(value) != plain(parameter.default):
                differ.append(f"{path}.{name}: {plain(value)!r} in conf/, {parameter.default!r} in {node._target_}")
    assert checked > 0
    assert differ == [], "; ".join(differ) + " (change the class's default too, or drop it)"
