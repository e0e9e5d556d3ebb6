"""A model config built for its data: the one place where the data's facts reach the LightningModule."""

import re
from collections.abc import Mapping
from typing import Any

import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig

from ddp_engine.core.errors import ConfigValueError


def build_model(model: DictConfig, data: Any) -> L.LightningModule:
    """Instantiate the ``model`` config node (its ``_target_``: the LightningModule) for ``data``
    (a DataModule, or what describes one, such as the description a
    checkpoint holds, or the arguments themselves, a mapping): with the
    keyword arguments its ``model_arguments()`` gives
    (:meth:`~ddp_engine.data.sharded.ShardedDataModule.model_arguments`; none without it),
    nested as the config is (``net``: the network's, such as the image classifier's
    input shape and output count).

    Raises:
        ConfigValueError: when a class does not take an argument that the data gives it (named,
            with the arguments the data gives and the fix).
        hydra.errors.InstantiationException: any other error of the classes' constructors.
    """
    if isinstance(data, Mapping):
        arguments = dict(data)
    else:
        arguments = data.model_arguments() if hasattr(data, "model_arguments") else {}
    try:
        return instantiate(model, **arguments)
    except InstantiationException as error:
        taken = re.search(r"unexpected keyword argument '(\w+)'", str(error.__cause__))
        # The config node whose class refused one of the data's arguments: a nested one's (net), or the module's.
        node = next(
            (key for key, value in arguments.items() if isinstance(value, dict) and taken and taken[1] in value), None
        )
        if taken is None or (node is None and taken[1] not in arguments):
            raise
        given = arguments[node] if node else arguments
        path, target = (f"model.{node}", model[node]._target_) if node else ("model", model._target_)
        raise ConfigValueError(
            f"{path}: {target} does not take {taken[1]}. It is built for the data with {', '.join(given)} as "
            f"arguments ({_named(data)}; engine/docs/tasks.md)."
        ) from None


def _named(data: Any) -> str:
    """Where the model's arguments came from, for a message: ``SensorDataModule.model_arguments()``."""
    return "the checkpoint's data" if isinstance(data, Mapping) else f"{type(data).__name__}.model_arguments()"
