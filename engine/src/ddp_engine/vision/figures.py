"""Matplotlib figures of images and of a confusion matrix (:mod:`ddp_engine.loggers.media` writes them to the loggers).

The figures are built on ``matplotlib.figure.Figure`` directly, never through pyplot's global
state, so they need no display and are safe in every DDP process.
"""

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import Tensor
from torchmetrics.utilities.plot import plot_confusion_matrix

#: Largest confusion matrix whose cells get their count written in them (beyond, they would not fit).
MAX_ANNOTATED_CLASSES = 20


def image_grid(pixels: Tensor, titles: Sequence[str], heading: str = "", columns: int = 8) -> Figure:
    """A grid of images, each with a title above it (its label, or true and predicted class).

    The images are tiled into one picture drawn on one axes, the titles written onto it: matplotlib
    lays out one axes per image slowly, and the first training step waits for the input grid. A
    28x28 image gets a 1.2 x 1.4 inch cell at 80 dpi (768 x 112 pixels per row of 8); larger images
    are scaled down to cells of at most 1.6 inches.

    Args:
        pixels: ``(N, C, H, W)`` float32 on a 0..1 scale (:meth:`~ddp_engine.vision.spec.DataSpec.denormalize`);
            one or two channels are shown as gray levels (the first), three or more as RGB (the first three).
        titles: ``N`` strings, one per image.
        heading: the figure's title, which says what the image titles are (default none).
        columns: images per row (default 8).

    Raises:
        ValueError: if ``pixels`` is empty or ``titles`` does not have one entry per image.
    """
    if len(pixels) == 0 or len(titles) != len(pixels):
        raise ValueError(f"image_grid needs one title per image and at least one image, got {len(pixels)} images "
                         f"and {len(titles)} titles")  # fmt: skip
    pixels = pixels.detach().float().cpu().clamp(0, 1)
    pixels = pixels[:, :3] if pixels.shape[1] >= 3 else pixels[:, :1].expand(-1, 3, -1, -1)  # (N, 3, H, W)
    rows = math.ceil(len(pixels) / columns)
    width = pixels.shape[3]
    band = max(12, width * 12 // 28)  # rows of the cell above its image, for its title
    # Each image in a cell with a margin of 4 pixels on the sides and 2 below.
    cells = F.pad(pixels, (4, 4, band, 2))
    cells = torch.cat([cells, cells.new_zeros(rows * columns - len(cells), *cells.shape[1:])])
    _, cell_h, cell_w = cells.shape[1:]
    grid = cells.reshape(rows, columns, 3, cell_h, cell_w).permute(0, 3, 1, 4, 2).reshape(rows * cell_h, -1, 3)

    inch = min(1 / 30, 1.6 / cell_w)  # inches per image pixel: 28x28 images in cells of 1.2 x 1.4 inches
    figure = Figure(figsize=(inch * cell_w * columns, inch * cell_h * rows), dpi=80, facecolor="black")
    heading_in = 0.3 if heading else 0.0  # inches at the top for the heading
    axes = figure.add_axes((0, 0, 1, 1 - heading_in / (inch * cell_h * rows)))
    axes.set_axis_off()
    axes.imshow(grid.numpy(), vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    for index, title in enumerate(titles):
        row, column = divmod(index, columns)
        axes.text(column * cell_w + cell_w / 2, row * cell_h + band / 2, title, color="white", fontsize=9,
                  ha="center", va="center")  # fmt: skip
    if heading:
        top = 1 - heading_in / 2 / (inch * cell_h * rows)
        figure.text(0.5, top, heading, color="white", fontsize=10, ha="center", va="center")
    return figure


def confusion_matrix_figure(matrix: Tensor, class_names: Sequence[str]) -> Figure:
    """A ``(C, C)`` confusion matrix of counts (rows: true class, columns: predicted class) as a
    heat map, with the count in each cell for up to :data:`MAX_ANNOTATED_CLASSES` classes, drawn by
    torchmetrics' own plot; ``class_names``: ``C`` axis labels."""
    figure = Figure(figsize=(7, 6), dpi=80, layout="constrained")
    annotate = len(class_names) <= MAX_ANNOTATED_CLASSES
    plot_confusion_matrix(matrix.cpu(), ax=figure.subplots(), add_text=annotate, labels=list(class_names))
    return figure
