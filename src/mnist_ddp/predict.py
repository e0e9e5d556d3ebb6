"""``python -m mnist_ddp.predict ckpt_path=<checkpoint> input=<folder or IDX file> [key=value ...]``:
the class of every input, each once, over ``trainer.devices`` DDP processes, in ``predictions.csv``."""

from ddp_engine.api import entry_point

from mnist_ddp.task import TASK

main, cli = entry_point(TASK, "predict")

if __name__ == "__main__":
    cli()
