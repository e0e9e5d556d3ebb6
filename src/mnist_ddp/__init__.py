"""mnist-ddp: an image classifier (an MNIST CNN by default) trained with data parallelism under PyTorch Lightning,
composed by Hydra."""

__version__ = "0.1.0"
