"""A training run's saved config, read back to use one of its checkpoints: the model it built and
the data set it trained on.

``python -m mnist_ddp.eval`` (and ``predict``, ``export``) rebuilds the model from the run's
``.hydra/config.yaml`` and uses the data set the run trained on, so that a network trained on
Fashion-MNIST is not scored on MNIST, nor fed MNIST's normalization, because the command's defaults
say MNIST. Where the files are (``data.data_dir``) and how they are loaded (workers, device, batch
size) stay the command's own.
"""

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, ListConfig, OmegaConf

from mnist_ddp.cli.schema import upgrade_targets
from mnist_ddp.errors import ConfigValueError

log = logging.getLogger(__name__)
info = rank_zero_only(log.info)

#: The keys of ``data`` that say which data set a run trained on: its class, folder layout, file
#: names, download, class names and normalization statistics (``conf/data/*.yaml``).
DATA_SET_KEYS = ("_target_", "subdir", "files", "download", "class_names", "mean", "std")


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


def use_data_set_of_run(cfg: DictConfig, checkpoint: Path) -> None:
    """Set the data set keys of ``cfg.data`` to those of the run that wrote ``checkpoint``
    (:func:`data_set_of_run`, against this Hydra job's overrides), and log on global rank 0 which
    keys were taken, or, when the run left no config, which data set this command assumes.

    Raises:
        ConfigValueError: see :func:`data_set_of_run` (the command line checks it before launch).
    """
    run = saved_run_config(checkpoint)
    taken = data_set_of_run(cfg.data, run, checkpoint, HydraConfig.get().overrides.task)
    if run is not None:
        info(f"Data set of the checkpoint's run: {', '.join(taken) or 'the same as this command'}")
    else:
        info(
            f"No run config at {run_config_path(checkpoint)}: using this command's data set "
            f"(data.subdir={cfg.data.subdir}, data.mean={cfg.data.mean}, data.std={cfg.data.std})"
        )


def data_set_of_run(data: DictConfig, run: DictConfig | None, checkpoint: Path, overrides: Sequence[str]) -> list[str]:
    """Set the data set keys (:data:`DATA_SET_KEYS`) of ``data``, this command's data config, to
    those of the run that wrote ``checkpoint``, in place.

    Args:
        data: this command's ``data`` node.
        run: that run's config (:func:`saved_run_config`), or None when it left none.
        checkpoint: the checkpoint to evaluate (named in the messages).
        overrides: this command's overrides (``data=fashion_mnist``, ``data.mean=0.5`` ...): a key
            they set must agree with the run's.

    Returns:
        ``key=value`` of each key taken from the run; empty when they all agreed or the run left
        no config.

    Raises:
        ConfigValueError: when an override sets a data set key (or chooses a ``data`` group
            whose value of one) other than the run's, naming both values.
    """
    if run is None or "data" not in run:
        return []
    explicit = _overridden_data_keys(overrides)
    taken = []
    for key in DATA_SET_KEYS:
        ours, theirs = _plain(data.get(key)), _plain(run.data.get(key))
        if ours == theirs:
            continue
        if key in explicit or "" in explicit:
            given = f"data.{key}={ours}" if key in explicit else f"data={explicit['']} (data.{key}={ours})"
            raise ConfigValueError(
                f"{given}: the checkpoint's run trained on data.{key}={theirs} ({run_config_path(checkpoint)}). "
                "Leave it out to use the data set (and normalization) the model was trained for."
            )
        if isinstance(theirs, dict):  # a typed node (data.files): its keys one by one
            for name, value in theirs.items():
                data[key][name] = value
        else:
            data[key] = theirs
        taken.append(f"data.{key}={theirs}")
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


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value) if isinstance(value, DictConfig | ListConfig) else value
