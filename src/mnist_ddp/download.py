"""Fetch MNIST ahead of training: ``python -m mnist_ddp.download [--data-dir DIR] [--mirror URL]``.

For clusters whose compute nodes have no internet: run this once where there is (a login node),
into a folder the training reads (``data.data_dir=DIR``), shared by the nodes or copied onto each.
Training finds the files and downloads nothing. Exits 0 when the four files are in place, 1 with
one line on stderr when they are not and cannot be fetched.
"""

import argparse
import sys
from collections.abc import Sequence

from ddp_engine.api import DataNotAvailableError, first_line
from ddp_engine.vision.idx import ensure_mnist_files
from torchvision.datasets import MNIST


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m mnist_ddp.download",
        description="Fetch the four MNIST files into DATA_DIR/MNIST/raw/, for training without internet.",
    )
    parser.add_argument("--data-dir", default="data", help="folder to hold MNIST/raw/ (default: data, as training)")
    parser.add_argument(
        "--mirror",
        action="append",
        help="base URL of an MNIST mirror holding the four .gz files, e.g. an internal one; "
        "repeat for several (default: torchvision's public mirrors)",
    )
    args = parser.parse_args(argv)
    if args.mirror:
        # torchvision tries its mirrors in this order; each URL must end with a slash.
        MNIST.mirrors = [url if url.endswith("/") else url + "/" for url in args.mirror]
    try:
        raw = ensure_mnist_files(args.data_dir)
    except DataNotAvailableError as error:
        print(f"Error: {first_line(error)}", file=sys.stderr)
        sys.exit(1)
    print(f"MNIST is in {raw.resolve()}; train with data.data_dir={raw.parent.parent.resolve()}")


if __name__ == "__main__":
    main()
