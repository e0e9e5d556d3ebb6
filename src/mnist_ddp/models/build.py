"""A model config built for a data set: the one place where the data's facts reach the network."""

import re

import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig

from mnist_ddp.core.errors import ConfigValueError
from mnist_ddp.data.spec import DataSpec


def build_model(model: DictConfig, spec: DataSpec) -> L.LightningModule:
    """Instantiate the ``model`` config node (its ``_target_``: the LightningModule) for the data that
    ``spec`` describes: ``model.net`` gets the data's ``in_channels``, ``image_size`` and
    ``num_classes`` (:meth:`~mnist_ddp.data.spec.DataSpec.network_arguments`), the module gets
    ``data_spec``.

    Raises:
        ConfigValueError: when the network's class does not take those three arguments (named,
            with the fix).
        hydra.errors.InstantiationException: any other error of the classes' constructors.
    """
    try:
        return instantiate(model, net=spec.network_arguments(), data_spec=spec.to_dict())
    except InstantiationException as error:
        taken = re.search(r"unexpected keyword argument '(in_channels|image_size|num_classes)'", str(error.__cause__))
        if taken is None:
            raise
        raise ConfigValueError(
            f"model.net: {model.net._target_} does not take {taken[1]}. Every network takes the data's in_channels, "
            "image_size and num_classes as its first three arguments (docs/customizing.md#a-network-of-your-own)."
        ) from None
