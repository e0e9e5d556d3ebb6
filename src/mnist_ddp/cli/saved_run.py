"""A training run's saved config, read back to use one of its checkpoints: the model it built and
the data set it trained on.

``python -m mnist_ddp.eval`` (and ``predict``, ``export``) rebuilds the model from the run's
``.hydra/config.yaml`` and uses the data set the run trained on (its whole ``data`` node), so that
a network trained on Fashion-MNIST or on a folder of images is not scored on MNIST, nor fed
MNIST's normalization, because the command's defaults say MNIST: the checkpoint is all such a
command needs. Where the files are and how they are loaded (:data:`LOADING_KEYS`) can be the
command's own, by its command line.
"""

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from mnist_ddp.cli.command_line import run_data_option
from mnist_ddp.cli.schema import upgrade_targets
from mnist_ddp.data.spec import DataSpec, read_data_spec
from mnist_ddp.errors import ConfigValueError

log = logging.getLogger(__name__)
info = rank_zero_only(log.info)

#: The keys of ``data`` that say where a data set is and how it is loaded, not which data set it is:
#: a command that applies a run's checkpoint takes them from its own command line when it sets them.
#: Every other key says which data set the run trained on; the command may not contradict it.
LOADING_KEYS = (
    "data_dir", "root", "cache_dir", "global_batch_size", "num_workers", "on_device", "prepare_data_per_node",
    "in_memory_limit_mib",
)  # fmt: skip


def run_config_path(checkpoint: Path) -> Path:
    """Where the run that wrote ``checkpoint`` (``<run>/checkpoints/<file>.ckpt``) keeps its config."""
    return Path(checkpoint).parent.parent / ".hydra" / "config.yaml"


def saved_run_config(checkpoint: Path) -> DictConfig | None:
    """The config of the run that wrote ``checkpoint``, with the ``_target_``s of earlier versions
    renamed to today's (:func:`~mnist_ddp.cli.schema.upgrade_targets`); None without one."""
    path = run_config_path(checkpoint)
    return upgrade_targets(OmegaConf.load(path)) if path.is_file() else None


def model_config(cfg: DictConfig, checkpoint: Path) -> DictConfig:
    """The ``model`` node of the run that wrote ``checkpoint``, else ``cfg.model`` (logged on global rank 0)."""
    run = saved_run_config(checkpoint)
    if run is not None:
        info(f"Model config from the checkpoint's run: {run_config_path(checkpoint)}")
        return run.model
    info(f"No run config at {run_config_path(checkpoint)}: using model={cfg.model.net._target_} from this command")
    return cfg.model


def data_spec_of_checkpoint(cfg: DictConfig, checkpoint: Path) -> DataSpec:
    """The data set ``checkpoint`` was trained for: the spec it keeps, or, for a checkpoint of an
    earlier version, which kept none, the spec of ``cfg.data`` (the run's data set:
    :func:`use_data_set_of_run`), whose files are not read for it."""
    return read_data_spec(checkpoint) or instantiate(cfg.data).spec


def use_data_set_of_run(cfg: DictConfig, checkpoint: Path) -> None:
    """Set ``cfg.data`` to the data set of the run that wrote ``checkpoint`` (:func:`data_set_of_run`,
    against this Hydra job's overrides), and log on global rank 0 which keys were taken, or, when the
    run left no config, that this command's data set is assumed.

    Raises:
        ConfigValueError: see :func:`data_set_of_run` (the command line checks it before launch).
    """
    run = saved_run_config(checkpoint)
    taken = data_set_of_run(cfg, run, checkpoint, HydraConfig.get().overrides.task)
    if run is not None:
        info(f"Data set of the checkpoint's run: {', '.join(taken) or 'the same as this command'}")
    else:
        info(f"No run config at {run_config_path(checkpoint)}: using this command's data set ({cfg.data._target_})")


def data_set_of_run(cfg: DictConfig, run: DictConfig | None, checkpoint: Path, overrides: Sequence[str]) -> list[str]:
    """Replace ``cfg.data``, this command's data config, by the ``data`` node of the run that wrote
    ``checkpoint``, keeping the :data:`LOADING_KEYS` that this command's ``overrides`` set.

    Args:
        cfg: this command's config.
        run: that run's config (:func:`saved_run_config`), or None when it left none.
        checkpoint: the checkpoint to apply (named in the messages).
        overrides: this command's overrides (``data=fashion_mnist``, ``data.mean=0.5``,
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
    taken = []
    for key in dict.fromkeys([*theirs, *ours]):
        if key in LOADING_KEYS:
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
    for key in LOADING_KEYS:
        if key in explicit and key in ours and key in theirs:
            data[key] = ours._get_node(key)._value()
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
