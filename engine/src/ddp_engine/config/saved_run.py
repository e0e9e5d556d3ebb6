"""A training run's saved config, read back to use one of its checkpoints: the model it built and
the data set it trained on.

``python -m <project>.eval`` (and ``predict``, ``export``) rebuilds the model from the run's
``.hydra/config.yaml`` and uses the data set the run trained on (its whole ``data`` node), so that
a model trained on another data set than the task's default is neither scored on the default one
nor fed its normalization: the checkpoint is all such a command needs. Where the files are and how
they are loaded (the DataModule's ``loading_keys``) can be the command's own, by its command line.
"""

import importlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from ddp_engine.config.schema import TaskConfig
from ddp_engine.config.trust import check_option, check_saved_config
from ddp_engine.core.errors import ConfigValueError

log = logging.getLogger(__name__)

#: The entry points that apply a training run's checkpoint (its model, its data set) instead of
#: training, and what each does with it (for the messages).
CHECKPOINT_USES = {"eval": "evaluation", "predict": "prediction", "export": "export"}


def run_data_option(checkpoint: Path) -> str | None:
    """The ``data`` option (``sensors``, ``folder``, ...) of the run that wrote ``checkpoint``
    (``<run>/checkpoints/<file>.ckpt``), from the Hydra record in its ``.hydra/hydra.yaml``; None
    without one.

    Raises:
        ConfigValueError: for a choice that is a path, not an option's name
            (:func:`~ddp_engine.config.trust.check_option`).
    """
    record = Path(checkpoint).parent.parent / ".hydra" / "hydra.yaml"
    if not record.is_file():
        return None
    choice = OmegaConf.select(OmegaConf.load(record), "hydra.runtime.choices.data", default=None)
    if choice:
        check_option("data", str(choice), f"{record} (hydra.runtime.choices.data)")
    return str(choice) if choice else None


def loading_keys(data: DictConfig) -> tuple[str, ...]:
    """The keys of ``data`` (a ``data`` node) that its DataModule declares as where and how its data
    is loaded (``ShardedDataModule.loading_keys``; the class is imported); none for a class that
    cannot be imported or declares none: then every key is the run's."""
    module, _, name = str(data.get("_target_", "")).rpartition(".")
    try:
        return tuple(getattr(getattr(importlib.import_module(module), name), "loading_keys", ()))
    except (ImportError, AttributeError, ValueError):
        return ()


def run_config_path(checkpoint: Path) -> Path:
    """Where the run that wrote ``checkpoint`` (``<run>/checkpoints/<file>.ckpt``) keeps its config."""
    return Path(checkpoint).parent.parent / ".hydra" / "config.yaml"


def saved_run_config(checkpoint: Path, trusted: Sequence[str] = ()) -> DictConfig | None:
    """The config of the run that wrote ``checkpoint``; None without one.

    Raises:
        ConfigValueError: for a ``_target_`` in it that the project does not trust, nor ``trusted``
            (this command's ``trusted_targets``: :func:`~ddp_engine.config.trust.check_saved_config`).
    """
    path = run_config_path(checkpoint)
    if not path.is_file():
        return None
    check_saved_config(path, trusted)
    return OmegaConf.load(path)


def apply_run_settings(cfg: DictConfig, overrides: Sequence[str], config_name: str, log_them: bool = False) -> None:
    """Set ``cfg.model`` and ``cfg.data`` to the model and data set of the run that wrote the
    checkpoint ``cfg.ckpt_path`` (:func:`data_set_of_run`, against the job's ``overrides``), in place;
    ``cfg.task`` to the run's task too (its metrics, its callbacks), with this command's ``task.``
    overrides applied to it (:func:`task_of_run`), unless ``overrides`` choose a task
    (``task=<option>``: that one, whole).

    The one place a run's saved settings are applied: the pre-launch check applies them to the job
    it checks, the entry point to the job Hydra composed, before any worker starts; the workers
    read ``cfg.model`` and ``cfg.data`` as they are. A run that left no config keeps this
    command's model and data set.

    Args:
        cfg: the job's config (eval, predict or export).
        overrides: the job's command-line overrides.
        config_name: the command (a key of :data:`CHECKPOINT_USES`), for the messages.
        log_them: log which settings were taken (the entry point, once per job; not the check).

    Raises:
        ConfigValueError: for ``ckpt_path=last`` (a training run's resume in place, not a file),
            for an override that contradicts the run's data set, and for a target in the run's
            config that neither the project nor ``cfg.trusted_targets`` trusts.
    """
    if cfg.ckpt_path == "last":
        raise ConfigValueError(
            f"ckpt_path=last: {CHECKPOINT_USES[config_name]} needs a checkpoint file, such as "
            "ckpt_path=logs/runs/<run>/checkpoints/last.ckpt (or the best epoch_<N>.ckpt beside it)."
        )
    checkpoint = Path(cfg.ckpt_path).resolve()
    run = saved_run_config(checkpoint, cfg.get("trusted_targets") or ())
    taken = data_set_of_run(cfg, run, checkpoint, overrides)
    if run is not None:
        with open_dict(cfg):
            cfg.model = run.model
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        if "task" in run and "task" in cfg and not any(override.key_or_group == "task" for override in parsed):
            cfg.task = task_of_run(cfg.task, run.task, parsed)
    if not log_them:
        return
    if run is not None:
        log.info(
            f"Model and data set of the checkpoint's run ({run_config_path(checkpoint)}): "
            f"{', '.join(taken) or 'the data set is the same as this command'}"
        )
    else:
        log.info(
            f"No run config at {run_config_path(checkpoint)}: using this command's model "
            f"({cfg.model.net._target_}) and data set ({cfg.data._target_})"
        )


def task_of_run(task: DictConfig, run_task: DictConfig, overrides: Sequence[Override]) -> DictConfig:
    """The run's task (``run_task``, from its saved config) with this command's overrides of
    ``task.`` keys applied: a key set (``task.metrics=[test/mse]``, ``+task.x=1``) takes its value in
    ``task``, this command's composed task, which holds them (``overrides``: parsed by Hydra's
    ``OverridesParser``); a key removed (``~task.callbacks.<name>``)
    is removed. So ``eval`` of a run trained with ``task.metrics=...`` shows that run's metrics. Its
    ``predict`` and ``export`` are this command's, the task's code as it is now: where its functions
    are, and whether it has them, are not the run's to say."""
    composed = OmegaConf.create({"task": OmegaConf.to_container(task, resolve=False)})
    commands = {command: composed.task.get(command) for command in ("predict", "export")}
    result = OmegaConf.create({"task": OmegaConf.merge(OmegaConf.structured(TaskConfig), run_task, commands)})
    for override in overrides:
        path = override.key_or_group
        if not path.startswith("task."):
            continue
        if override.is_delete():
            parent, _, name = path.rpartition(".")
            node = OmegaConf.select(result, parent)
            if isinstance(node, DictConfig) and name in node:
                del node[name]
        else:
            OmegaConf.update(result, path, OmegaConf.select(composed, path), force_add=True)
    return result.task


def data_set_of_run(cfg: DictConfig, run: DictConfig | None, checkpoint: Path, overrides: Sequence[str]) -> list[str]:
    """Replace ``cfg.data``, this command's data config, by the ``data`` node of the run that wrote
    ``checkpoint``, keeping the keys that this command's ``overrides`` set among those its DataModule
    declares as loading keys (:func:`loading_keys`) and ``global_batch_size`` (an evaluation's batch
    changes none of its results).

    Args:
        cfg: this command's config.
        run: that run's config (:func:`saved_run_config`), or None when it left none.
        checkpoint: the checkpoint to apply (named in the messages).
        overrides: this command's overrides (``data=<option>``, ``data.mean=0.5``,
            ``data.data_dir=/elsewhere`` ...): a key other than the loading keys that they set
            must agree with the run's.

    Returns:
        ``key=value`` of each key of the run's that differs from this command's default; empty
        when they all agreed or the run left no config.

    Raises:
        ConfigValueError: when an override sets a data set key (or chooses a ``data`` group
            whose value of one) other than the run's, naming both values.
    """
    if run is None or "data" not in run:
        return []
    explicit = _overridden_data_keys(overrides)
    if "" in explicit and explicit[""] == run_data_option(checkpoint):
        del explicit[""]  # the run's own data option (the entry point puts it in front): its values are the run's
    ours, theirs = cfg.data, run.data
    loading = {*loading_keys(theirs), "global_batch_size"}
    taken = []
    for key in dict.fromkeys([*theirs, *ours]):
        if key in loading:
            continue
        mine, run_value = _plain(ours.get(key)), _plain(theirs.get(key))
        if mine == run_value:
            continue
        if key in explicit or "" in explicit:
            mine_text, run_text = _as_override(mine), _as_override(run_value)
            given = f"data.{key}={mine_text}" if key in explicit else f"data={explicit['']} (data.{key}={mine_text})"
            raise ConfigValueError(
                f"{given}: the checkpoint's run trained on data.{key}={run_text} ({run_config_path(checkpoint)}). "
                "Leave it out to use the data set (and normalization) the model was trained for."
            )
        if key in theirs:
            taken.append(f"data.{key}={run_value}")
    data = OmegaConf.create(OmegaConf.to_container(theirs, resolve=False))
    written = OmegaConf.to_container(ours, resolve=False)  # as given: an interpolation stays one
    for key in loading:
        if key in explicit and key in ours and key in theirs:
            data[key] = written[key]
    with open_dict(cfg):
        cfg.data = data
    return taken


def _overridden_data_keys(overrides: Sequence[str]) -> dict[str, str]:
    """``{data key: value}`` set by ``overrides``, with ``""`` for a choice of the ``data`` group."""
    keys = {}
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        name = override.key_or_group
        if name == "data":
            keys[""] = override.get_value_element_as_str()
        elif name.startswith("data."):
            keys[name.split(".")[1]] = override.get_value_element_as_str()
    return keys


def _as_override(value: Any) -> str:
    """A value as a command line writes it: ``null``, ``true``, ``[A,B]``, ``0.5``."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, list):
        return f"[{','.join(_as_override(item) for item in value)}]"
    return str(value)


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value) if isinstance(value, DictConfig | ListConfig) else value
