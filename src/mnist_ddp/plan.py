"""``python -m mnist_ddp.plan [training overrides]``: plans a training's layout on a cluster
(``trainer.num_nodes=8 trainer.devices=8``) on this machine: each device's batch, learning rate and
memory, each step's AllReduce, and whether it starts, as one rank over torch's fake process group."""

from ddp_engine.api import entry_point

from mnist_ddp.task import TASK

main, cli = entry_point(TASK, "plan")

if __name__ == "__main__":
    cli()
