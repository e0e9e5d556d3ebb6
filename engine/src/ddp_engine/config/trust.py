"""What a run folder may make this process build: the ``_target_`` of each object its saved files name.

``eval``, ``predict``, ``export`` and a resume in place rebuild the model, the data set and the
task's callbacks from a run's ``.hydra/`` files, and Hydra imports and calls whatever a ``_target_``
names. Anyone who had the folder (a colleague's run, a cluster's, a release asset) could have edited
those files, so every target read from them is checked first against the modules the project trusts
(:data:`TRUSTED_MODULES`, the task's own package and the modules it names,
:attr:`ddp_engine.task.Task.trusted_modules`): a target outside them is refused, naming the
file and line, before it is imported or built. A user who trusts the folder allows a target for one
command with ``trusted_targets=[module.Name]``; a run never carries that on, since it is read from the
command line only. The project's own YAML and the command line are not checked: they are the user's.
"""

import importlib
import re
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from ddp_engine.core.errors import ConfigValueError, first_line
from ddp_engine.task import current

#: Where a class or function that a saved run builds may be defined (its ``__module__``, by dotted
#: prefix), besides the task's own package: the engine's parts that a config builds and the library
#: modules that the engine's and the template's configs name. None of them runs a command, or loads
#: code or pickles from a path it is given.
TRUSTED_MODULES = (
    "ddp_engine.callbacks", "ddp_engine.data", "ddp_engine.distributed", "ddp_engine.loggers",
    "ddp_engine.models", "ddp_engine.vision", "ddp_engine.launch.sweep_summary",
    "torch.nn", "torch.optim",
    "torchvision.transforms", "torchvision.models",
    "torchmetrics.classification", "torchmetrics.regression", "torchmetrics.aggregation",
    "torchmetrics.collections", "torchmetrics.metric",
    "lightning.pytorch.callbacks", "lightning.pytorch.loggers", "lightning.pytorch.profilers",
    "lightning.pytorch.trainer",
    "datetime",
)  # fmt: skip

#: The command-line key that trusts targets for one command (a list of names or module prefixes).
TRUST_KEY = "trusted_targets"

#: The key that sets the environment of a job's processes, which a saved override may not set.
ENVIRONMENT_KEY = "launcher.env"

#: The top-level keys of a run's saved config that eval, predict and export build from.
BUILT_FROM_A_RUN = ("model", "data", "task")

#: Where the refusals point.
DOCS = "engine/docs/usage.md#run-folders-from-elsewhere"

_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def trusted_targets(args: Sequence[str]) -> tuple[str, ...]:
    """The targets that the command line ``args`` trusts (``trusted_targets=[a.B,c]``); none unless given."""
    for override in OverridesParser.create().parse_overrides([arg for arg in args if not arg.startswith("-")]):
        if override.key_or_group == TRUST_KEY and not override.is_delete():
            value = override.value()
            return tuple(str(item) for item in value) if isinstance(value, list) else (str(value),)
    return ()


def check_saved_config(path: Path, trusted: Sequence[str] = (), keys: Sequence[str] = BUILT_FROM_A_RUN) -> None:
    """Refuse the saved config at ``path`` (a run's ``.hydra/config.yaml``) when a ``_target_`` under
    its top-level ``keys`` (what a command builds from it) names an object that is neither defined in
    a trusted module nor named by ``trusted`` (this command's ``trusted_targets``).

    Raises:
        ConfigValueError: naming the target, the file and its line, and how to allow it.
    """
    root = _read(Path(path), "config")
    if not isinstance(root, yaml.MappingNode):
        raise ConfigValueError(f"{path}: not a run's config (a mapping of keys); this run folder was edited.")
    for key, node in root.value:
        if isinstance(key, yaml.ScalarNode) and key.value in keys:
            if not isinstance(node, yaml.MappingNode):  # ${other}: resolved against this file, unchecked
                where, name = f"{path}:{node.start_mark.line + 1}", key.value
                raise ConfigValueError(
                    f"{where}: {name}: a run saves its {name} as a node of its own, not a reference to another; "
                    "this run folder was edited."
                )
            for value, line in _scalars(node):
                _check_builds_no_node(value, f"{path}:{line}")
            for target, line in _targets(node):
                check_target(target, f"{path}:{line}", trusted)


def check_saved_overrides(path: Path, trusted: Sequence[str] = (), given: Collection[str] = ()) -> None:
    """Refuse the saved overrides at ``path`` (a run's ``.hydra/overrides.yaml``, put in front of a
    command line) where one whose key the command line does not set again (``given``) sets a
    ``_target_`` that is not trusted (:func:`check_target`), sets a key of Hydra's own (``hydra.*``:
    Hydra records those in ``hydra.yaml``, and they can set the environment or the search path) or
    the processes' environment (``launcher.env``: ``PYTHONPATH`` would import from the folder), or
    chooses a config by a path (``model=../../x``: Hydra would load that file) instead of an option's name.

    Raises:
        ConfigValueError: naming the override, the file and its line, and what to do.
    """
    node = _read(Path(path), "overrides")
    if not isinstance(node, yaml.SequenceNode | None):
        raise ConfigValueError(f"{path}: not a run's overrides (a list of key=value); this run folder was edited.")
    parser = OverridesParser.create()
    for item in node.value if node is not None else ():
        where = f"{path}:{item.start_mark.line + 1}"
        if not isinstance(item, yaml.ScalarNode):
            raise ConfigValueError(f"{where}: not an override (key=value); this run folder was edited.")
        text = str(item.value)
        _check_builds_no_node(text, where)
        try:
            (override,) = parser.parse_overrides([text])
        except Exception as error:  # Hydra's parser raises its own error types
            raise ConfigValueError(f"{where}: {text}: not an override ({first_line(error)}).") from None
        key = override.key_or_group
        if key in given or key == TRUST_KEY:
            continue
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            raise ConfigValueError(
                f"{where}: {text}: a run's saved overrides never set Hydra's own keys (Hydra keeps those "
                "in hydra.yaml), so this run folder was edited. Give the key on the command line yourself."
            )
        if key == ENVIRONMENT_KEY or key.startswith(f"{ENVIRONMENT_KEY}."):
            raise ConfigValueError(
                f"{where}: {text}: the environment of a run's processes (PYTHONPATH, LD_PRELOAD ...) is "
                "never taken from a run folder; give it on the command line yourself if you trust it."
            )
        value = None if override.is_delete() else override.value()
        if "." not in key:  # a config group's choice, or a top-level key
            for option in value if isinstance(value, list) else [value]:
                if isinstance(option, str):
                    check_option(key, option, where)
        if key == "_target_" or key.endswith("._target_"):
            check_target(value, f"{where}: {text}", trusted)
        for target in targets_in(value):
            check_target(target, f"{where}: {text}", trusted)


def check_option(group: str, option: str, where: str) -> None:
    """Refuse ``option``, a saved choice of the config ``group`` (read at ``where``), that is a path
    (``../``, ``/``, ``pkg://``) rather than the name of one of the project's configs.

    Raises:
        ConfigValueError: naming the choice and ``where``.
    """
    if option.startswith("/") or "://" in option or ".." in option.split("/"):
        raise ConfigValueError(
            f"{where}: {group}={option}: a saved choice names a config of the project's own {group} "
            "group, never a path to a file (Hydra would load that file); this run folder was edited."
        )


def check_target(target: object, where: str, trusted: Sequence[str] = ()) -> None:
    """Refuse ``target`` (a ``_target_`` read at ``where``) unless ``trusted`` names it (the name or a
    dotted prefix of it) or it names a class or function defined in a trusted module: only modules of
    the trusted modules' packages are imported to tell.

    Raises:
        ConfigValueError: naming the target, ``where``, and how to allow it.
    """
    name = str(target) if isinstance(target, str) else repr(target)
    if isinstance(target, str) and any(name == entry or name.startswith(f"{entry}.") for entry in trusted):
        return
    defined_in = _defined_in(target) if isinstance(target, str) and _DOTTED_NAME.fullmatch(target) else None
    if defined_in is not None and _is_trusted(defined_in):
        return
    what = f"defined in {defined_in}" if defined_in else "not a class or function of a trusted module"
    raise ConfigValueError(
        f"{where}: _target_: {name} ({what}) is not among what a saved run may build (the task's "
        f"package, the engine's parts, torch.nn/optim, torchvision, torchmetrics, Lightning's callbacks "
        f"and loggers; a task adds its libraries' in Task.trusted_modules). If you trust this run folder, allow "
        f"it for this command: '{TRUST_KEY}=[{name}]' ({DOCS})."
    )


def _trusted_modules() -> tuple[str, ...]:
    task = current()
    return (task.package, *task.trusted_modules, *TRUSTED_MODULES)


def _is_trusted(module: str) -> bool:
    return any(module == prefix or module.startswith(f"{prefix}.") for prefix in _trusted_modules())


def _defined_in(target: str) -> str | None:
    """The module that defines the class or function ``target`` names (its ``__module__``), found by
    importing modules of the trusted packages only; None when it names nothing there."""
    parts = target.split(".")
    if parts[0] not in {prefix.split(".")[0] for prefix in _trusted_modules()} or any(
        part.startswith("__") for part in parts
    ):
        return None
    for end in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        try:
            for attribute in parts[end:]:
                found = getattr(found, attribute)
        except AttributeError:
            return None
        module = getattr(found, "__module__", None) if end < len(parts) else None
        return module if isinstance(module, str) and (isinstance(found, type) or callable(found)) else None
    return None


def _read(path: Path, kind: str) -> yaml.Node | None:
    """The YAML file ``path`` (a run's ``kind``: config, overrides) as nodes, each with its line;
    refused in one line where it cannot be read as OmegaConf reads it (a tag, a syntax error)."""
    try:
        node = yaml.compose(path.read_text())
        OmegaConf.load(path)
    except Exception as error:  # YAML's errors, OmegaConf's, a file that is not text
        raise ConfigValueError(
            f"{path}: cannot be read as a run's {kind} ({getattr(error, 'problem', None) or first_line(error)}); "
            "this run folder was edited or cut short."
        ) from None
    return node


#: A value that builds config nodes from a string when it is resolved: what it builds is seen by no check.
_BUILDS_NODES = re.compile(r"\$\{\s*oc\.(create|decode)\s*:")


def _check_builds_no_node(value: object, where: str) -> None:
    """Refuse a saved ``value`` that builds config nodes from a string (``${oc.create:...}``)."""
    if isinstance(value, str) and _BUILDS_NODES.search(value):
        raise ConfigValueError(
            f"{where}: {value}: a saved value that builds config from a string (oc.create, oc.decode) could "
            "name any target, and a run never saves one; this run folder was edited."
        )


def _scalars(node: yaml.Node | None) -> Iterator[tuple[object, int]]:
    """Each scalar value (not key) in the YAML ``node``, with its line (1-based)."""
    if isinstance(node, yaml.ScalarNode):
        yield node.value, node.start_mark.line + 1
    elif isinstance(node, yaml.MappingNode):
        for _, value in node.value:
            yield from _scalars(value)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from _scalars(item)


def _targets(node: yaml.Node | None) -> Iterator[tuple[object, int]]:
    """Each ``_target_`` value in the YAML ``node``, with its line (1-based)."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == "_target_":
                target = value.value if isinstance(value, yaml.ScalarNode) else repr(value.value)
                yield target, value.start_mark.line + 1
            else:
                yield from _targets(value)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from _targets(item)


def targets_in(value: object) -> Iterator[object]:
    """Each ``_target_`` in ``value`` (an override's value as Hydra parsed it, a config as a container)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "_target_":
                yield item
            else:
                yield from targets_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from targets_in(item)
