"""One rank of a world size of any size, in this process alone: the Trainer of a plan
(``python -m <package>.plan``) runs the strategy of the training as that rank over torch's fake
process group, whose collectives move nothing, so that what the rank builds and steps (its shard,
its DDP buckets, its optimizer state) is what it would hold on the cluster.

Every rank of a data-parallel job holds the same objects that Lightning broadcasts from rank 0 (a
folder's name, a decision), so the rank keeps its own; DDP's AllReduce of each gradient bucket
goes through the fake group and returns the bucket as it is (the plan counts its bytes, it sends
none).
"""

from typing import Any

import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import ClusterEnvironment
from typing_extensions import override

from ddp_engine.distributed.strategy import CommHookDDPStrategy


class PlannedRank(ClusterEnvironment):
    """The cluster environment of one process that plays global rank ``global_rank`` of
    ``num_nodes`` x ``devices_per_node`` processes: no process is started, nothing listens."""

    def __init__(self, global_rank: int, num_nodes: int, devices_per_node: int) -> None:
        super().__init__()
        self._global_rank, self._num_nodes, self.devices_per_node = global_rank, num_nodes, devices_per_node

    @property
    @override
    def creates_processes_externally(self) -> bool:
        return True  # Lightning starts no other process

    @property
    @override
    def main_address(self) -> str:
        return "127.0.0.1"

    @property
    @override
    def main_port(self) -> int:
        return 0  # the fake group has no rendezvous

    @staticmethod
    @override
    def detect() -> bool:
        return False

    @override
    def world_size(self) -> int:
        return self._num_nodes * self.devices_per_node

    @override
    def set_world_size(self, size: int) -> None:
        pass  # the planned world size stays

    @override
    def global_rank(self) -> int:
        return self._global_rank

    @override
    def set_global_rank(self, rank: int) -> None:
        pass

    @override
    def local_rank(self) -> int:
        return self._global_rank % self.devices_per_node

    @override
    def node_rank(self) -> int:
        return self._global_rank // self.devices_per_node


class FakeRankStrategy(CommHookDDPStrategy):
    """The training's strategy (:class:`~ddp_engine.distributed.strategy.CommHookDDPStrategy`, the
    same arguments) as its cluster environment's rank, in the fake process group formed before it
    sets up (:func:`~ddp_engine.core.compat.init_fake_process_group`: Lightning keeps a group it finds)."""

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj  # every rank holds rank 0's object: the fake group would hand back no bytes

    @override
    def register_comm_hook(self) -> None:
        # The configured hook reads the AllReduce's result, which the fake group leaves empty; its bytes
        # are the plan's arithmetic (ddp_engine.callbacks.ddp_report.allreduce_bytes).
        self.model.register_comm_hook(None, unsent_allreduce)


def unsent_allreduce(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: the bucket through the process group's AllReduce (the fake one's:
    nothing sent), then the bucket as it is."""
    buffer = bucket.buffer()
    return dist.all_reduce(buffer, async_op=True).get_future().then(lambda _: buffer)
