"""``python -m mnist_ddp.export ckpt_path=<checkpoint> format=onnx|torch_export [output=<file>]``:
the checkpoint's network with its normalization inside, as one file checked against the checkpoint."""

from ddp_engine.api import entry_point

from mnist_ddp.task import TASK

main, cli = entry_point(TASK, "export")

if __name__ == "__main__":
    cli()
