"""One place per default: the engine's schema only says which keys exist and their types, and the
engine's own classes take no default or the one the engine's configs give (its groups, its data
bases ``sharded`` and ``image``, ``folder``), composed through both test tasks.

(Lightning's and torch's classes keep their own defaults: the engine's configs set what it
chooses differently, such as ``trainer.log_every_n_steps``.)
"""

import dataclasses
import inspect
from enum import Enum

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import get_object
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from vision_task.task import TASK as VISION_TASK

from ddp_engine.api import register
from ddp_engine.config import schema
from ddp_engine.config.compose import group_options, missing_values
from ddp_engine.config.schema import register_configs
from ddp_engine.vision import schema as vision_schema
from sensor_task.task import TASK as SENSOR_TASK

SCHEMAS = [
    obj
    for module in (schema, vision_schema)
    for obj in vars(module).values()
    if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__.startswith("ddp_engine.")
]


def unselected_member(field: dataclasses.Field) -> bool:
    """A member of a group that selects several (``logger``: ``tensorboard``, ``csv``, ...),
    typed ``<its schema> | None``: None means that it is not selected, not a default value."""
    return field.default is None and any(dataclasses.is_dataclass(arg) for arg in getattr(field.type, "__args__", ()))


@pytest.mark.parametrize("dataclass", SCHEMAS, ids=lambda dataclass: f"{dataclass.__module__}.{dataclass.__name__}")
def test_the_schema_holds_no_values(dataclass):
    with_a_value = [
        field.name
        for field in dataclasses.fields(dataclass)
        if field.default_factory is not dataclasses.MISSING
        or (field.default is not dataclasses.MISSING and field.default != MISSING and not unselected_member(field))
    ]
    assert with_a_value == [], f"{dataclass.__name__}: set these in the engine's configs, not in the schema"


#: Each command's config, with the keys its command line must set (the data set's file or folder:
#: the task's data option leaves it to the command line).
TASKS = {task.package: task for task in (SENSOR_TASK, VISION_TASK)}
REQUIRED = {
    "sensor_task": {"config": ["data.path"], "eval": ["data.path", "ckpt_path"], "predict": ["data.path", "ckpt_path"],
                  "export": ["data.path", "ckpt_path"], "plan": ["data.path"]},
    "vision_task": {"config": ["data.root"], "eval": ["data.root", "ckpt_path"],
                  "predict": ["data.root", "ckpt_path", "input"], "export": ["data.root", "ckpt_path"],
                  "plan": ["data.root"]},
}  # fmt: skip


def composed(task, config_name: str, *overrides: str) -> DictConfig:
    register(task)
    register_configs()
    with initialize_config_dir(config_dir=str(task.configs()), version_base="1.3"):
        return compose(config_name, overrides=list(overrides))


COMMANDS = [(task, config_name) for task in REQUIRED for config_name in REQUIRED[task]]


@pytest.mark.parametrize(("task", "config_name"), COMMANDS, ids=[":".join(command) for command in COMMANDS])
def test_the_engines_configs_set_every_key_but_those_the_command_line_gives(task, config_name):
    assert missing_values(composed(TASKS[task], config_name)) == REQUIRED[task][config_name]


def targets(node, path="") -> list[tuple[str, DictConfig]]:
    """Every ``(dotted path, node)`` under ``node`` whose ``_target_`` is a class of a test task or the engine."""
    found = []
    if isinstance(node, DictConfig) and not node._is_none():  # None: a logger not selected
        target = node._get_node("_target_")._value() if "_target_" in node else None
        if isinstance(target, str) and target.startswith(("ddp_engine.", "sensor_task.", "vision_task.")):
            found.append((path, node))
        for key in node:
            found += targets(node._get_node(key), f"{path}.{key}".lstrip("."))
    return found


def engine_classes(target: str) -> list[type]:
    """The engine's classes that build a ``_target_`` node: the class itself and, for a task's class
    (a DataModule over ``ShardedDataModule``), the engine's bases that its ``**kwargs`` reach."""
    return [cls for cls in inspect.getmro(get_object(target)) if cls.__module__.startswith("ddp_engine.")]


def plain(value):
    """A signature default or a config value, compared as the YAML would write it."""
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=False)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value.value if isinstance(value, Enum) else value


def options_of(task, group: str) -> list[str]:
    """The options of ``group`` on the task's search path (its conf/ and the engine's)."""
    register(task)
    register_configs()
    with initialize_config_dir(config_dir=str(task.configs()), version_base="1.3"):
        return group_options(group)


# Every strategy option through both tasks; every data option through the image task, which
# registers the schemas that the engine's image data sets compose with. (The model group is each
# task's own: conf/model/.)
CHOICES = [(task, "config", f"strategy={option}") for task in TASKS for option in options_of(TASKS[task], "strategy")]
CHOICES += [("vision_task", "config", f"data={option}") for option in options_of(VISION_TASK, "data")]
CHOICES += [(task, config_name, "") for task, config_name in COMMANDS]


@pytest.mark.parametrize(
    ("task", "config_name", "choice"),
    CHOICES,
    ids=[f"{task}:{name}:{choice or 'defaults'}" for task, name, choice in CHOICES],
)
def test_the_engines_class_defaults_are_the_configs_values(task, config_name, choice):
    overrides = [f"{key}=x" for key in REQUIRED[task][config_name]]
    cfg = composed(TASKS[task], config_name, *overrides, *([choice] if choice else []))
    checked, differ = 0, []
    for path, node in targets(cfg):
        if path.split(".")[0] == "model":
            continue  # the task's own choices (its conf/model/), such as the width of a network of the engine's
        for cls in engine_classes(node._target_):
            for name, parameter in inspect.signature(cls).parameters.items():
                if parameter.default is inspect.Parameter.empty or name not in node:
                    continue
                value = node._get_node(name)
                if isinstance(value._value(), str) and value._value().startswith("${"):
                    continue  # an interpolation (${seed}): its value is another key's
                checked += 1
                if plain(value) != plain(parameter.default):
                    differ.append(f"{path}.{name}: {plain(value)!r} in the config, {parameter.default!r} in {cls}")
    assert checked > 0
    assert differ == [], "; ".join(differ) + " (change the class's default too, or drop it)"
