"""Matplotlib figures of digits and of a confusion matrix (:mod:`mnist_ddp.loggers.media` writes them to the loggers).

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


def digit_grid(
    images: Tensor, titles: Sequence[str], mean: float, std: float, heading: str = "", columns: int = 8
) -> Figure:
    """A grid of digits, each with a title above it (its label, or true and predicted class).

    The figure is ``1.2 * columns`` by ``1.4 * rows`` inches at 80 dpi: 768 x 112 pixels per row of 8.
    The digits are tiled into one picture drawn on one axes, the titles written onto it: one axes
    per digit took about 50 ms per digit to lay out (1.7 s for a batch of 32, which the first
    training step waited for); this takes about 0.1 s.

    Args:
        images: ``(N, 1, 28, 28)`` float32, normalized as the DataModule serves them; shown
            un-normalized, white on black as in the data set.
        titles: ``N`` strings, one per image.
        mean, std: the normalization the images were served with (``data.mean``, ``data.std``).
        heading: the figure's title, which says what the digit titles are (default none).
        columns: digits per row (default 8).

    Raises:
        ValueError: if ``images`` is empty or ``titles`` does not have one entry per image.
    """
    if len(images) == 0 or len(titles) != len(images):
        raise ValueError(f"digit_grid needs one title per image and at least one image, got {len(images)} images "
                         f"and {len(titles)} titles")  # fmt: skip
    pixels = (images.detach().float().cpu()[:, 0] * std + mean).clamp(0, 1)  # (N, 28, 28)
    rows = math.ceil(len(images) / columns)
    # Each digit in a 36 x 42 pixel cell (the 1.2 x 1.4 inch shape of its place in the figure),
    # with 12 rows above it for its title.
    cells = F.pad(pixels, (4, 4, 12, 2))
    cells = torch.cat([cells, cells.new_zeros(rows * columns - len(cells), *cells.shape[1:])])
    cell_h, cell_w = cells.shape[1:]
    grid = cells.reshape(rows, columns, cell_h, cell_w).permute(0, 2, 1, 3).reshape(rows * cell_h, columns * cell_w)

    figure = Figure(figsize=(1.2 * columns, 1.4 * rows), dpi=80, facecolor="black")
    heading_in = 0.3 if heading else 0.0  # inches at the top for the heading
    axes = figure.add_axes((0, 0, 1, 1 - heading_in / (1.4 * rows)))
    axes.set_axis_off()
    axes.imshow(grid.numpy(), cmap="gray", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
    for index, title in enumerate(titles):
        row, column = divmod(index, columns)
        axes.text(column * cell_w + cell_w / 2, row * cell_h + 6, title, color="white", fontsize=9,
                  ha="center", va="center")  # fmt: skip
    if heading:
        top = 1 - heading_in / 2 / (1.4 * rows)
        figure.text(0.5, top, heading, color="white", fontsize=10, ha="center", va="center")
    return figure


def confusion_matrix_figure(matrix: Tensor, class_names: Sequence[str]) -> Figure:
    """A ``(C, C)`` confusion matrix of counts (rows: true class, columns: predicted class) as a
    heat map with the count in each cell, drawn by torchmetrics' own plot; ``class_names``: ``C``
    axis labels."""
    figure = Figure(figsize=(7, 6), dpi=80, layout="constrained")
    plot_confusion_matrix(matrix.cpu(), ax=figure.subplots(), add_text=True, labels=list(class_names))
    return figure
