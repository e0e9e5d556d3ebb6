"""Entry point: ``python -m mnist_ddp.export ckpt_path=<checkpoint> format=onnx|torch_export [output=<file>]``.

Writes the checkpoint's network, with its training run's normalization inside, as an ONNX model or
a ``torch.export`` program (by default beside the checkpoint: ``<stem>.onnx`` / ``<stem>.pt2``),
never over an existing file, and checks that the file computes the checkpoint's logits on 64 test
images: :mod:`mnist_ddp.run.export` says how, and what the exported model takes and returns.
One process; its run directory (``logs/exports/``) keeps its config, log and ``metrics.json``.

Like :mod:`mnist_ddp.train`, this module imports Hydra and the config schema only, so that a bad
command line is refused before torch and Lightning are imported.
"""

from ddp_engine.config.command_line import entry_point

from mnist_ddp.project import PROJECT

main, cli = entry_point(PROJECT, "export", task="task.export.run", result="output", in_process=True)

if __name__ == "__main__":
    cli()
