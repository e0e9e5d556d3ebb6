"""The names the config chooses among for the distributed options: ``strategy.comm_hook`` and
``lr_scaling.rule``.

Apart from the code that acts on them (:mod:`ddp_engine.distributed.strategy`, which imports torch
and Lightning; :mod:`ddp_engine.distributed.layout_rules`) so that the config schema
(:mod:`ddp_engine.config.schema`) types its fields with them, and refuses any other name, without
those imports.
"""

from enum import Enum


class CommHook(str, Enum):
    """Gradient communication hooks, by the names used in ``strategy.comm_hook``
    (:class:`ddp_engine.distributed.strategy.CommHookDDPStrategy` registers them)."""

    none = "none"
    fp16 = "fp16"
    bf16 = "bf16"
    powersgd = "powersgd"


class LRScaling(str, Enum):
    """How the learning rate follows the global batch size (``lr_scaling.rule``;
    :func:`ddp_engine.distributed.layout_rules.scale_learning_rate` applies it).

    - ``none``: ``model.optimizer.lr`` as configured.
    - ``linear``: lr x global / reference (Goyal et al., 2017, https://arxiv.org/abs/1706.02677).
    - ``sqrt``: lr x sqrt(global / reference) (Krizhevsky, 2014, https://arxiv.org/abs/1404.5997),
      milder, often better for adaptive optimizers such as Adam.
    """

    none = "none"
    linear = "linear"
    sqrt = "sqrt"
