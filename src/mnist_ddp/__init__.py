"""mnist-ddp: an MNIST CNN trained with data parallelism under PyTorch Lightning, composed by Hydra."""

__version__ = "0.1.0"
