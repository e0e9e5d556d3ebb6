"""The training images' split into training and validation, without torch: the rule that the data
set's schema applies before torch is imported (:meth:`mnist_ddp.schema.IDXDataConfig.check_values`)
and its DataModule again (:class:`mnist_ddp.data.MNISTDataModule`).
"""

from ddp_engine.api import ConfigValueError


def check_val_size(val_size: int, train_count: int) -> None:
    """Refuse a ``data.val_size`` that leaves no validation or no training image of the
    ``train_count`` training images.

    Raises:
        ConfigValueError: naming ``data.val_size`` and the training split's size.
    """
    if not 0 < val_size < train_count:
        raise ConfigValueError(
            f"data.val_size={val_size} must be between 1 and {train_count - 1} "
            f"(the training split has {train_count} images)."
        )
