"""A command line's jobs, composed by Hydra and checked against the schema: keys and types.

This module imports Hydra and OmegaConf only, not torch or Lightning (seconds each to import), so
that an unknown key, a value of the wrong type, an unknown group option or a required value left
unset is refused in about a second (:mod:`ddp_engine.config.command_line` runs it first).
"""

import ast
import dataclasses
import difflib
import functools
import importlib.util
import inspect
import itertools
from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.object_type import ObjectType
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from ddp_engine.config.resume import override_key
from ddp_engine.config.schema import TrainerConfig, register_configs
from ddp_engine.core.compat import declared_type
from ddp_engine.core.errors import ConfigValueError, UsageError, first_line
from ddp_engine.task import current


@dataclasses.dataclass
class Job:
    """One job of a command line, composed and its keys checked."""

    #: Its overrides (one combination of a ``-m`` sweep's values).
    overrides: list[str]
    #: Its config, with the ``hydra`` node (for the run directory and ``${hydra:...}``).
    cfg: DictConfig
    #: Whether it is a job of a ``-m`` sweep.
    multirun: bool
    #: The command line's overrides, a sweep's as given (``lr=0.1,0.2``), Hydra's own (``hydra.*``) included.
    command: list[str] = dataclasses.field(default_factory=list)


def group_options(group: str) -> list[str]:
    """The options of config group ``group`` (``logger``: ``csv``, ``tensorboard``, ...) on Hydra's
    search path: the task's ``conf/`` and the engine's (:mod:`ddp_engine.conf`), less the schemas
    (``*_schema``, the ConfigStore's) and, of ``data``, the YAMLs that build no DataModule (they
    hold keys that data sets share: their bases). Inside an initialized Hydra only (``initialize_config_dir``)."""
    loader = GlobalHydra.instance().config_loader()
    names = loader.get_group_options(group, results_filter=ObjectType.CONFIG)
    return [name for name in names if not name.endswith("_schema") and (group != "data" or _names_target(group, name))]


def _names_target(group: str, name: str) -> bool:
    """Whether the YAML ``<group>/<name>`` (its first on the search path) names a ``_target_``, itself
    or through the configs of its group that its defaults list starts from."""
    path = f"{group}/{name}"
    source = next(source for source in GlobalHydra.instance().config_loader().get_sources() if source.is_config(path))
    config = source.load_config(path).config
    if "_target_" in config and not OmegaConf.is_missing(config, "_target_"):
        return True
    bases = [entry for entry in config.get("defaults", []) if isinstance(entry, str) and entry != "_self_"]
    return any(_names_target(group, base) for base in bases if "/" not in base)


def composed_jobs(config_name: str, args: Sequence[str]) -> list[Job]:
    """Compose each job of the command line ``args``, checked: unknown keys (``+`` additions
    included), wrong types, values outside a choice, unknown group options, required values
    (``???``) left unset.

    Flags other than ``-m`` / ``--multirun`` (``--help``, ``--cfg``, ``--config-name`` ...) are
    Hydra's own business: such command lines are left to Hydra, and no job is returned.

    Returns:
        One :class:`Job` per job (a ``-m`` sweep expands into several).

    Raises:
        UsageError: the first problem found, as one line.
    """
    flags = [arg for arg in args if arg.startswith("-")]
    if any(flag not in ("-m", "--multirun") for flag in flags):
        return []
    overrides = with_trainer_arguments([arg for arg in args if not arg.startswith("-")])
    for key in ("hydra.run.dir", "hydra.sweep.dir"):
        if any(arg.split("=", 1) == [key, ""] for arg in overrides):
            raise ConfigValueError(f"{key} is empty (an unset shell variable?): give a folder, or leave {key} out.")
    register_configs()
    multirun = bool(flags)
    with initialize_config_dir(config_dir=str(current().configs()), version_base="1.3"):
        return [
            Job(job, _compose(config_name, job), multirun, overrides)
            for job in (sweep_jobs(overrides) if multirun else [overrides])
        ]


def task_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides of ``overrides`` that set the job's config, not Hydra's own (``hydra.*``,
    ``hydra/<group>=``): what Hydra records as the job's ``hydra.overrides.task``."""
    return [override for override in overrides if override_key(override).split(".")[0].split("/")[0] != "hydra"]


def sweep_jobs(overrides: Sequence[str]) -> list[list[str]]:
    """The override lists of the jobs a ``-m`` sweep runs (Hydra's basic sweeper: the cartesian
    product of every ``a,b`` / ``range()`` / ``choice()``). Sweeps that cannot be enumerated
    (``interval()`` for Optuna, ``glob()``) are left out: their jobs are checked with the
    configured value."""
    choices = []
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.get_key_element()
        if not override.is_sweep_override():
            choices.append([f"{key}={override.get_value_element_as_str()}"])
        elif override.is_discrete_sweep() and override.value_type.name != "GLOB_CHOICE_SWEEP":
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
    return [list(job) for job in itertools.product(*choices)]


def _compose(config_name: str, overrides: list[str]) -> DictConfig:
    """The job's config with its ``hydra`` node, its keys checked."""
    try:
        cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
    except MissingConfigException as error:
        group, _, option = (error.missing_cfg_file or "").rpartition("/")
        # Hydra's own message lists the options for a single choice (logger=x), not for one inside a
        # list (logger=[csv,x]); group_options lists them for both.
        options = group_options(group)
        close = difflib.get_close_matches(option, options, n=1)
        raise UsageError(
            f"{group}={option}: no such option (available: {', '.join(options)}; yours go in conf/{group}/)."
            + (f" Did you mean {group}={close[0]}?" if close else "")
        ) from None
    except (ConfigCompositionException, HydraException, OmegaConfBaseException) as error:
        raise UsageError(_describe(error, _with_choices(config_name, overrides))) from None
    except AssertionError:  # OmegaConf.update under a null node: a key of a logger not selected
        raise UsageError(_under_null_node(overrides, compose(config_name))) from None
    check_data_target(cfg)
    if unknown := unknown_keys(cfg):
        raise UsageError(_unknown_key(unknown[0], cfg))
    missing = missing_values(cfg)
    if missing:
        raise UsageError(
            f"Missing value{'s' * (len(missing) > 1)} (???) for {', '.join(missing)}: set "
            f"{'them' if len(missing) > 1 else 'it'} in the config file or on the command line ({missing[0]}=...)."
        )
    return cfg


def child_config(node: DictConfig | ListConfig, key: str | int) -> DictConfig | ListConfig | None:
    """``node[key]`` when it is a config node of its own, to look into; None for a value, a null
    node, ``???``, and an interpolation (which is not resolved: ``${hydra:...}`` has no value before
    Hydra creates the run directory)."""
    if OmegaConf.is_interpolation(node, key) or OmegaConf.is_missing(node, key):
        return None
    child = node[key]
    return child if isinstance(child, DictConfig | ListConfig) else None


def missing_values(node: DictConfig | ListConfig, prefix: str = "") -> list[str]:
    """The dotted keys under ``node`` whose value is ``???`` (``hydra``, Hydra's own node, left out).

    ``OmegaConf.missing_keys`` would do, but it resolves every interpolation on its way, and
    ``${hydra:runtime.output_dir}`` has no value before Hydra creates the run directory.
    """
    found = []
    for key in range(len(node)) if isinstance(node, ListConfig) else node:
        full_key = f"{prefix}{key}" if isinstance(key, str) else f"{prefix[:-1]}[{key}]"
        if full_key == "hydra":
            continue
        if OmegaConf.is_missing(node, key):
            found.append(full_key)
        elif (child := child_config(node, key)) is not None:
            found.extend(missing_values(child, f"{full_key}."))
    return found


@functools.cache
def trainer_arguments() -> frozenset[str]:
    """The arguments of ``lightning.pytorch.Trainer``: any of them is a known ``trainer`` key, also
    one the schema leaves out (``trainer.max_time=...`` needs no ``+``: :func:`with_trainer_arguments`).

    Read from the signature of ``Trainer.__init__`` in Lightning's installed source, parsed, not
    imported: importing Lightning takes seconds, and this check runs before (a test compares the
    result with ``inspect.signature`` of the imported class). Where the source cannot be read
    (Lightning installed as bytecode only), Lightning is imported.
    """
    spec = importlib.util.find_spec("lightning")  # finds the package without importing it
    source = Path(spec.origin).parent / "pytorch" / "trainer" / "trainer.py" if spec and spec.origin else None
    if source is not None and source.is_file():
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ClassDef) and node.name == "Trainer":
                init = next(item for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "__init__")
                arguments = [*init.args.posonlyargs, *init.args.args, *init.args.kwonlyargs]
                return frozenset(argument.arg for argument in arguments) - {"self"}
    from lightning.pytorch import Trainer

    return frozenset(inspect.signature(Trainer.__init__).parameters) - {"self"}


def _schema_fields(schema: type) -> set[str]:
    return {field.name for field in dataclasses.fields(schema)}


def with_trainer_arguments(args: Sequence[str]) -> list[str]:
    """``args`` with ``trainer.<name>=...`` written ``+trainer.<name>=...`` where ``name`` is an
    argument of Lightning's Trainer that the schema (:class:`~ddp_engine.config.schema.TrainerConfig`)
    leaves out: Hydra adds a key only with ``+``, and a Trainer argument is no unknown key."""
    schema = _schema_fields(TrainerConfig)
    rewritten = []
    for arg in args:
        key = arg.split("=", 1)[0]
        name = key.removeprefix("trainer.")
        if key.startswith("trainer.") and "=" in arg and name not in schema and name in trainer_arguments():
            arg = f"+{arg}"
        rewritten.append(arg)
    return rewritten


def check_data_target(cfg: DictConfig) -> None:
    """Refuse a ``data`` option that builds no DataModule (a base of data sets), and ``data._target_``
    set to another class than the one its data set's schema says it builds (its ``builds``, a class
    variable: ``data._target_=my_project.MyDataModule`` on top of a data option with a schema): the other keys would
    be that data set's, not that class's.

    Raises:
        UsageError: naming the option or the class, and the way: a YAML of its own in ``conf/data/``.
    """
    data = cfg.get("data")
    if isinstance(data, DictConfig) and "_target_" not in data:
        option = OmegaConf.select(cfg, "hydra.runtime.choices.data", default=None)
        raise UsageError(
            f"data={option} builds no DataModule (it names no _target_): it holds keys that data sets share. "
            "Choose a data set: an option of conf/data/ that names its DataModule (engine/docs/tasks.md)."
        )
    expected = getattr(OmegaConf.get_type(data), "builds", None) if isinstance(data, DictConfig) else None
    if expected is not None and data.get("_target_") != expected:
        raise UsageError(
            f"data._target_={data._target_}: the keys of this data option are {expected}'s. A DataModule of your "
            f"own gets a YAML of its own, conf/data/<name>.yaml (its _target_: {data._target_}, and its "
            "arguments), used with data=<name> (engine/docs/tasks.md)."
        )


#: The nodes checked against the arguments of their ``_target_`` class where no schema types them.
SIGNATURE_CHECKED = ("data.", "model.")


@functools.cache
def constructor_arguments(target: str, key: str = "data") -> tuple[str, ...] | None:
    """The keyword arguments that the class ``target`` (an import path; ``key._target_``, for the
    message) takes, following ``**kwargs`` up its base classes (a subclass that passes them on to its
    base takes the base's too); None when it takes any (``**kwargs`` all the way up).

    Read from the class's source where its ``__init__`` names every argument (:func:`_source_arguments`:
    importing a LightningModule imports torch and Lightning, seconds), else from the imported class.

    Raises:
        UsageError: when ``target`` cannot be imported, naming it.
    """
    module, _, name = target.rpartition(".")
    if (found := _source_arguments(module, name)) is not None:
        return found
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as error:
        raise UsageError(f"{key}._target_={target} cannot be imported ({first_line(error)}).") from None
    names: list[str] = []
    for klass in inspect.getmro(found) if isinstance(found, type) else ():
        if "__init__" not in vars(klass):
            continue
        parameters = list(inspect.signature(vars(klass)["__init__"]).parameters.values())[1:]
        names += [
            p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in names
        ]
        if not any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters):
            return tuple(names)
    return None


def _source_arguments(module: str, name: str, depth: int = 0, exact: bool = False) -> tuple[str, ...] | None:
    """The arguments of class ``name``'s ``__init__`` in ``module``'s source file, parsed, not
    imported, following ``**kwargs`` (or a class without ``__init__`` of its own) to its one base
    class where the source names where it comes from (a class of the module, or an import of it);
    None where the sources do not tell them all (no source, several bases, a base such as
    ``L.LightningDataModule``, ``**kwargs`` all the way up). ``exact``: None also where an
    ``__init__`` takes ``**kwargs`` (which it may pass elsewhere than to its base)."""
    found = _class_source(module, name)
    if found is None or depth > 8:
        return None
    klass, tree, module, package = found
    init = next((node for node in klass.body if isinstance(node, ast.FunctionDef) and node.name == "__init__"), None)
    names = [argument.arg for argument in [*init.args.args[1:], *init.args.kwonlyargs]] if init is not None else []
    if init is not None and init.args.kwarg is None:
        return tuple(names)
    if (exact and init is not None) or len(klass.bases) != 1 or not isinstance(klass.bases[0], ast.Name):
        return None
    base = _import_of(klass.bases[0].id, tree, module, package)
    inherited = _source_arguments(*base, depth + 1, exact) if base is not None else None
    return None if inherited is None else tuple(dict.fromkeys([*names, *inherited]))


def _class_source(module: str, name: str, depth: int = 0) -> tuple[ast.ClassDef, ast.Module, str, str] | None:
    """Class ``name`` of ``module``'s source file, or of the module it imports it from (a re-export,
    such as ``ddp_engine.api``'s): the class, its file parsed, its module and that module's package;
    None where no Python source defines it."""
    found = _module_source(module)
    if found is None or depth > 8:
        return None
    source, package = found
    tree = ast.parse(source.read_text())
    klass = next((node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == name), None)
    if klass is not None:
        return klass, tree, module, package
    imported = _import_of(name, tree, module, package)
    return None if imported is None or imported[0] == module else _class_source(*imported, depth + 1)


def _module_source(module: str) -> tuple[Path, str] | None:
    """The source file of ``module`` and its package, found without importing anything: Python's
    ``find_spec`` of a dotted name imports its parent packages (``torch.optim``: torch, seconds). None
    where the module is not a ``.py`` file under its top-level package's folder."""
    top, *parts = module.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    if not parts:
        package = top if spec.submodule_search_locations else ""
        return (Path(spec.origin), package) if spec.origin.endswith(".py") else None
    for folder in spec.submodule_search_locations or ():
        path = Path(folder, *parts)
        if (path / "__init__.py").is_file():
            return path / "__init__.py", module
        if path.with_suffix(".py").is_file():
            return path.with_suffix(".py"), module.rpartition(".")[0]
    return None


def _import_of(name: str, tree: ast.Module, module: str, package: str) -> tuple[str, str] | None:
    """``(module, class name)`` of what ``name`` is in the module ``tree`` was parsed from: a class of
    its own, or one it imports by name (``from x import Base``, also under ``if TYPE_CHECKING:``)."""
    if any(isinstance(node, ast.ClassDef) and node.name == name for node in tree.body):
        return module, name
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    source = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
                    return source, alias.name
    return None


def unknown_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """The dotted keys under ``node`` that its schema (a dataclass of :mod:`ddp_engine.config.schema`)
    does not have: added with ``+``, by a typo or for an option that does not exist. The nodes the
    schema leaves open on purpose (typed ``Any`` or ``dict``: ``callbacks``, ``model.net``,
    ``model.optimizer`` and ``model.scheduler``, whose keyword arguments their classes check when
    they are built, ``launcher.env``) are not looked into, nor is ``hydra`` (Hydra checks its own);
    under ``trainer`` every argument of Lightning's Trainer is known (:func:`trainer_arguments`);
    a ``data`` node without a schema (a DataModule of the user's own) is checked against its
    class's arguments (:func:`constructor_arguments`)."""
    schema = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(schema):
        if prefix in SIGNATURE_CHECKED and isinstance(node.get("_target_"), str):
            known = constructor_arguments(node._target_, prefix[:-1])
            return [] if known is None else [f"{prefix}{key}" for key in node if key not in (*known, "_target_")]
        return []
    known = _schema_fields(schema) | ({"hydra"} if not prefix else set())
    found = []
    for key in node:
        if key not in known and not (schema is TrainerConfig and key in trainer_arguments()):
            found.append(f"{prefix}{key}")
        elif key != "hydra" and isinstance(child := child_config(node, key), DictConfig):
            found.extend(unknown_keys(child, f"{prefix}{key}."))
    return found


def _declared_type(cfg: DictConfig, key: str) -> type | None:
    """The schema type declared for ``key`` in ``cfg``, even where its value is null (a logger not selected)."""
    holder_key, _, name = key.rpartition(".")
    holder = OmegaConf.select(cfg, holder_key) if holder_key else cfg
    return declared_type(holder, name) if isinstance(holder, DictConfig) and name in holder else None


def _under_null_node(overrides: Sequence[str], defaults: DictConfig) -> str:
    """The message for an override that sets a key under a node that is null in ``defaults``."""
    for override in overrides:
        key = override.lstrip("+~").partition("=")[0]
        parent = key.rpartition(".")[0]
        if parent and "." in parent and OmegaConf.select(defaults, parent) is None:
            group, _, option = parent.rpartition(".")
            return (f"{key}: {parent} is not selected, so it has no keys to set; select it first: "
                    f"{group}={option}, or {group}=[tensorboard,{option}] for both.")  # fmt: skip
    return "the command line sets a key under a node that is null in the config."


#: The arguments that the task passes to an optimizer or a scheduler it builds (``_partial_: true``),
#: never set in the config.
PASSED_BY_THE_TASK = ("params", "optimizer")


def _target_arguments(node: object, exact: bool) -> tuple[str, ...] | None:
    """The arguments of ``node``'s ``_target_`` class, read from its source (:func:`_source_arguments`,
    nothing imported; ``exact`` as there); None where ``node`` has no ``_target_`` or its source does
    not name them all."""
    if not isinstance(node, DictConfig) or not isinstance(target := node.get("_target_"), str):
        return None
    module, _, name = target.rpartition(".")
    return _source_arguments(module, name, exact=exact) if module else None


def _unknown_key(key: str, cfg: DictConfig) -> str:
    """The message for ``key``, which ``cfg`` (its schema) does not have: the keys it could be."""
    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    schema = OmegaConf.get_type(node) if isinstance(node, DictConfig) else _declared_type(cfg, parent)
    unset: set[str] = set()  # the keys that exist only once added with a +
    if parent == "trainer":
        keys = sorted(trainer_arguments())
        allowed = "trainer takes the arguments of lightning.pytorch.Trainer"
    elif f"{parent}." in SIGNATURE_CHECKED and not dataclasses.is_dataclass(schema) and isinstance(node, DictConfig):
        keys = sorted(constructor_arguments(node._target_, parent) or ())
        allowed = f"{node._target_} takes {', '.join(keys)}"
    elif (
        not dataclasses.is_dataclass(schema)
        and name not in PASSED_BY_THE_TASK
        and name in (_target_arguments(node, exact=False) or ())
    ):
        # An open node built by its _target_ (model.optimizer: torch.optim.AdamW), whose class's
        # source names the argument: one the config does not set is added with a +.
        return f"{key} is an argument of {node._target_} that the config does not set: add it with +{key}=..."
    elif not dataclasses.is_dataclass(schema) and (arguments := _target_arguments(node, exact=True)) is not None:
        keys = [argument for argument in arguments if argument not in PASSED_BY_THE_TASK]
        allowed = f"{node._target_} takes {', '.join(keys)}"
        unset = {argument for argument in keys if argument not in node}
    else:
        if dataclasses.is_dataclass(schema):
            keys = sorted(_schema_fields(schema))
        else:
            keys = sorted(str(known) for known in node if known != name) if isinstance(node, DictConfig) else []
        # A null node whose schema is not known (compat.declared_type): its keys cannot be listed.
        allowed = f"keys of {parent or 'the config'}: {', '.join(keys) or ('none' if schema else 'not known')}"
    close = difflib.get_close_matches(name, keys, n=1)
    plus = "+" if close and close[0] in unset else ""
    hint = f" Did you mean {plus}{parent + '.' if parent else ''}{close[0]}?" if close else ""
    return f"Unknown key {key} ({allowed}).{hint}"


def _with_choices(config_name: str, overrides: Sequence[str]) -> DictConfig:
    """The config with only the group choices of ``overrides`` (``data=folder``, not its keys): what an
    unknown key is described against, so that ``data=folder data.roots=x`` lists the folder's keys.
    Without the choices when they do not compose either."""
    choices = [override for override in overrides if "=" in override and "." not in override.split("=", 1)[0]]
    choices = [override for override in choices if not override.startswith(("+", "~"))]
    try:
        return compose(config_name, overrides=choices)
    except (ConfigCompositionException, HydraException, OmegaConfBaseException):
        return compose(config_name)


def _describe(error: Exception, defaults: DictConfig) -> str:
    """One line for a composition error; an unknown key is described with the keys of ``defaults``
    (the config with this command's group choices, without its other overrides)."""
    cause = error.__cause__ or error
    if isinstance(cause, ConfigKeyError | ConfigAttributeError) and cause.full_key:
        return _unknown_key(cause.full_key, defaults)
    if isinstance(cause, ValidationError) and cause.full_key:
        return f"{cause.full_key}: {first_line(cause)}."
    return first_line(error)
