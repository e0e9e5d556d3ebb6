"""The input pipeline alone: how many samples/s one process's train loader serves, with no model.

    python -m benchmarks.pipeline --data-dir data    # these tables alone; benchmarks.run measures them too

Every loader serves what the model takes, normalized float32 images: the template's loaders serve
uint8 pixels, which its DataModule normalizes in ``on_after_batch_transfer`` (after the copy to the
device, on the device), so every batch of theirs goes through that hook in the measured loop.

MNIST from its IDX files (:func:`measure_input_pipelines`): three loaders over 55,000 training images
(the train split's size), per-device batch 32 (the fast recipe's global batch 64 over 2 processes),
shuffled, one process, ``num_workers=0``:

- ``template``: the DataModule's own train loader (in-memory tensors, one gather per batch:
  ``GatherDataset``), normalized by its hook;
- ``tensor_dataset``: a ``TensorDataset`` of the same images normalized once beforehand, with
  ``DataLoader(batch_size=32)``, as the hand-written reference loads them (per-sample ``__getitem__``
  and ``default_collate``);
- ``pil``: torchvision's ``MNIST`` dataset with ``ToTensor`` and ``Normalize``: a PIL image per
  sample, the path of most MNIST examples.

MNIST as a folder of PNG images (``data=folder``; :func:`measure_folder`, which writes the tree once
with :func:`write_png_tree`): the same split sizes and batch, over ``train/<digit>/*.png``:

- ``folder_in_memory``: ``ImageFolderDataModule``, every image decoded into memory at setup (the
  data fits under ``in_memory_limit_mib``), then a gather per batch, as for the IDX files;
- ``folder_lazy_0``: ``in_memory_limit_mib=0``: each sample decoded from its file by Pillow when
  it is served, in the process (``num_workers=0``);
- ``folder_lazy_2``: the same in 2 DataLoader workers (persistent, as the template makes them);
- ``imagefolder``: torchvision's ``ImageFolder`` with ``Grayscale`` / ``ToTensor`` / ``Normalize``,
  ``DataLoader(shuffle=True, num_workers=2, persistent_workers=True)``: the path of most
  folder examples.

And the training step's data wait (:func:`measure_data_wait`): the time a step spends waiting for
its next batch when the default CNN's forward, backward and SGD step consume the batches, per
folder loader of the DataModule; the decoding of the workers then overlaps the step.
"""

import argparse
import json
import os
import shutil
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from ddp_engine.vision.classification import ClassificationDataModule
from ddp_engine.vision.folder import ImageFolderDataModule
from ddp_engine.vision.idx import MNIST_FILES, find_idx_file, read_idx_split
from PIL import Image
from torch.utils.data import DataLoader, Subset, TensorDataset
from torchvision import transforms
from torchvision.datasets import MNIST, ImageFolder

from mnist_ddp.data import DIGITS, MNIST_MEAN, MNIST_STD, MNISTDataModule
from mnist_ddp.networks import CNN

REPO = Path(__file__).resolve().parents[1]
PER_DEVICE_BATCH = 32
PASSES = 5
#: Images of train/ held out for validation, as MNISTDataModule holds out 5,000: 55,000 to train on.
VAL_SIZE = 5000
#: Samples per pass of the loaders that decode per sample (their rate does not change over an epoch).
LAZY_SAMPLES = 5000
#: Timed training steps per pass of the data-wait loop, and the untimed ones before them.
WAIT_STEPS, WAIT_WARMUP = 100, 10
#: torch's intra-op threads of the data-wait loop's training step: one, so that the step's time is the
#: same whether or not DataLoader workers (or another process) take a core; with two threads on 2 cores
#: an OpenMP region waits for whichever thread was descheduled (measured: 368 ms per step instead of 36 ms
#: while the machine ran other processes).
WAIT_THREADS = 1
#: The file :func:`write_png_tree` writes last, describing a complete tree.
TREE_MARKER = ".complete.json"
TREE_VERSION = 1
#: The PNG tree and the folder DataModule's survey cache, under the caller's cache folder.
TREE_NAME, SURVEY_NAME = "mnist-png", "folder-survey"

Batch = Any


def samples_per_second(loader: Iterable, samples: int, prepare: Callable[[Batch], Batch] | None = None) -> float:
    """Samples/s of iterating ``loader`` until ``samples`` samples are served (whole batches), each
    batch passed through ``prepare`` (the DataModule's ``on_after_batch_transfer``) when given."""
    served, start = 0, time.perf_counter()
    for batch in loader:
        images = (prepare(batch) if prepare is not None else batch)[0]
        served += len(images)
        if served >= samples:
            break
    return served / (time.perf_counter() - start)


def one_process(datamodule: ClassificationDataModule) -> ClassificationDataModule:
    """``datamodule`` set up for training in one process (the DataModules read world size and rank
    from their Trainer)."""
    datamodule.trainer = SimpleNamespace(world_size=1, global_rank=0, accumulate_grad_batches=1)
    datamodule.setup("fit")
    return datamodule


def hook(datamodule: ClassificationDataModule) -> Callable[[Batch], Batch]:
    """The DataModule's normalization of a batch, as Lightning applies it after the copy to the device."""
    return lambda batch: datamodule.on_after_batch_transfer(batch, 0)


def median_rates(loaders: Mapping[str, tuple[Iterable, int, Callable | None]], passes: int) -> dict[str, float]:
    """Median samples/s over ``passes`` passes of each ``name: (loader, samples per pass, prepare)``,
    the loaders taken in turn in each pass, so that a slow spell of the machine hits all of them."""
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(passes):
        for name, (loader, samples, prepare) in loaders.items():
            rates[name].append(samples_per_second(loader, samples, prepare))
    return {name: statistics.median(values) for name, values in rates.items()}


def measure_input_pipelines(data_dir: Path, samples: int | None = None, passes: int = PASSES) -> dict[str, float]:
    """Median samples/s over ``passes`` passes of each MNIST loader (see the module docstring), the
    loaders in turn in each pass.

    Args:
        data_dir: folder with ``MNIST/raw/<four IDX files>``.
        samples: samples per pass (default: one epoch, 55,000, for the in-memory loaders; 10,000
            for the PIL path, which is far slower: its rate does not change over an epoch).
    """
    datamodule = one_process(MNISTDataModule(str(data_dir), global_batch_size=PER_DEVICE_BATCH))
    train_set = datamodule.train_set
    images, labels = train_set.tensors
    # The reference's loader: the images normalized once, as float32, when they are loaded.
    normalized = datamodule.spec.normalize(images)
    pil = MNIST(data_dir, train=True, transform=transforms.Compose(
        [transforms.ToTensor(), transforms.Normalize((MNIST_MEAN,), (MNIST_STD,))]
    ))  # fmt: skip
    pil_train = Subset(pil, range(len(train_set)))  # as many images as the train split
    loaders = {
        "template": (datamodule.train_dataloader(), samples or len(train_set), hook(datamodule)),
        "tensor_dataset": (
            DataLoader(TensorDataset(normalized, labels), batch_size=PER_DEVICE_BATCH, shuffle=True),
            samples or len(train_set),
            None,
        ),
        "pil": (
            DataLoader(pil_train, batch_size=PER_DEVICE_BATCH, shuffle=True),
            min(samples or 10_000, 10_000),
            None,
        ),
    }
    return median_rates(loaders, passes)


# MNIST as a folder of PNG images.


def write_png_tree(
    idx_dir: Path, out_dir: Path, files: Mapping[str, str] = MNIST_FILES, class_names: Sequence[str] = DIGITS
) -> Path:
    """Write an IDX data set (MNIST by default) as an ImageFolder tree of grayscale PNGs,
    ``out_dir/train/<class>/<n>.png`` and ``out_dir/test/<class>/<n>.png`` (``n`` the image's
    position in its IDX file), unless ``out_dir`` already holds the complete tree of these files.

    The marker :data:`TREE_MARKER` is written last and names the source files' sizes: a tree
    without it (an interrupted write) or written from other files is removed and written again.
    70,000 MNIST images take about 15 s on 2 CPU cores.

    Args:
        idx_dir: the folder with the four IDX files (``<data_dir>/MNIST/raw``).
        out_dir: where the tree goes; created. If it exists without the marker it may hold only
            ``train/`` and ``test/`` (what an interrupted write leaves), which are removed.
        files: the IDX file names by role (:data:`~ddp_engine.vision.idx.MNIST_FILES`).
        class_names: the folder name of each label.

    Returns:
        ``out_dir``.

    Raises:
        FileNotFoundError: when an IDX file is missing.
        FileExistsError: when ``out_dir`` holds other files than an unfinished tree.
        DataFormatError: from :func:`~ddp_engine.vision.idx.read_idx_split`, for a malformed file.
    """
    idx_dir, out_dir = Path(idx_dir), Path(out_dir)
    sources = {
        split: tuple(find_idx_file(idx_dir, files[f"{split}_{kind}"]) for kind in ("images", "labels"))
        for split in ("train", "test")
    }
    for path in (path for pair in sources.values() for path in pair):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: write_png_tree reads the four IDX files of {idx_dir}.")
    expected = {
        "version": TREE_VERSION,
        "sources": {path.name: path.stat().st_size for pair in sources.values() for path in pair},
        "class_names": list(class_names),
    }
    marker = out_dir / TREE_MARKER
    if marker.is_file():
        try:
            saved = json.loads(marker.read_text())
        except (OSError, ValueError):
            saved = {}
        if all(saved.get(key) == value for key, value in expected.items()):
            return out_dir
        marker.unlink()
    if out_dir.exists():
        others = sorted(set(os.listdir(out_dir)) - {"train", "test"})
        if others:
            raise FileExistsError(
                f"{out_dir} holds {', '.join(others)}: not a PNG tree that write_png_tree left unfinished; "
                "give an empty or new folder."
            )
        shutil.rmtree(out_dir)
    counts = {}
    for split, (images_file, labels_file) in sources.items():
        images, labels = read_idx_split(images_file, labels_file, len(class_names))
        width = len(str(len(images) - 1))
        for name in class_names:
            (out_dir / split / name).mkdir(parents=True)
        for index, (image, label) in enumerate(zip(images.numpy(), labels.tolist())):
            Image.fromarray(image).save(out_dir / split / class_names[label] / f"{index:0{width}d}.png")
        counts[split] = len(images)
    marker.write_text(json.dumps({**expected, "counts": counts}, indent=2) + "\n")
    return out_dir


def folder_datamodule(
    root: Path, lazy: bool = False, num_workers: int = 0, cache_dir: Path | None = None, val_size: float = VAL_SIZE
) -> ImageFolderDataModule:
    """The folder DataModule of ``root``, set up for training in one process, per-device batch 32:
    decoded into memory (the default ``in_memory_limit_mib``, which the data must fit under), or
    (``lazy``: ``in_memory_limit_mib=0``) per sample from disk by ``num_workers`` workers. The
    survey of the images is kept in ``cache_dir``, so that they are surveyed once for all."""
    datamodule = ImageFolderDataModule(
        str(root), global_batch_size=PER_DEVICE_BATCH, val_size=val_size, num_workers=num_workers,
        cache_dir=str(cache_dir) if cache_dir is not None else None, **({"in_memory_limit_mib": 0} if lazy else {}),
    )  # fmt: skip
    datamodule.prepare_data()
    if datamodule.in_memory == lazy:
        raise RuntimeError(f"{root} does not fit in memory under in_memory_limit_mib={datamodule.in_memory_limit_mib}")
    return one_process(datamodule)


#: The template's folder loaders: name -> (lazy, num_workers) of :func:`folder_datamodule`.
FOLDER_LOADERS = {"folder_in_memory": (False, 0), "folder_lazy_0": (True, 0), "folder_lazy_2": (True, 2)}


def folder_datamodules(
    root: Path, cache_dir: Path | None = None, val_size: float = VAL_SIZE
) -> dict[str, ImageFolderDataModule]:
    """One :func:`folder_datamodule` of ``root`` per :data:`FOLDER_LOADERS` entry, by name."""
    return {
        name: folder_datamodule(root, lazy, workers, cache_dir, val_size)
        for name, (lazy, workers) in FOLDER_LOADERS.items()
    }


def folder_samples(modules: Mapping[str, ImageFolderDataModule], samples: int | None, lazy_samples: int) -> dict:
    """Samples per pass of each folder loader: ``samples`` (default one epoch of the train split)
    in memory, at most ``lazy_samples`` for those that decode per sample."""
    epoch = len(modules["folder_in_memory"].train_set)
    per_sample = min(samples or lazy_samples, lazy_samples)
    return {"folder_in_memory": samples or epoch, "folder_lazy_0": per_sample, "folder_lazy_2": per_sample,
            "imagefolder": per_sample}  # fmt: skip


def measure_folder_pipelines(
    modules: Mapping[str, ImageFolderDataModule],
    samples: int | None = None,
    lazy_samples: int = LAZY_SAMPLES,
    passes: int = PASSES,
) -> dict[str, float]:
    """Median samples/s over ``passes`` passes of each folder loader (see the module docstring), the
    loaders in turn in each pass.

    Args:
        modules: :func:`folder_datamodules` of an ImageFolder tree (:func:`write_png_tree`).
        samples: samples per pass of ``folder_in_memory`` (default: one epoch of its train split).
        lazy_samples: samples per pass of the loaders that decode per sample (at most ``samples``).
    """
    counts = folder_samples(modules, samples, lazy_samples)
    loaders = {name: (module.train_dataloader(), counts[name], hook(module)) for name, module in modules.items()}
    in_memory = modules["folder_in_memory"]
    spec = in_memory.spec
    gray = [transforms.Grayscale(num_output_channels=1)] if spec.channels == 1 else []
    imagefolder = ImageFolder(
        str(in_memory.root / "train"),
        transform=transforms.Compose([*gray, transforms.ToTensor(), transforms.Normalize(spec.mean, spec.std)]),
    )
    loaders["imagefolder"] = (
        DataLoader(imagefolder, batch_size=PER_DEVICE_BATCH, shuffle=True, num_workers=2, persistent_workers=True),
        counts["imagefolder"],
        None,
    )
    return median_rates(loaders, passes)


def step_times(
    loader: Iterable, prepare: Callable[[Batch], Batch], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
    steps: int, warmup: int,
) -> tuple[float, float]:  # fmt: skip
    """Run ``warmup + steps`` training steps on ``loader``'s batches (a new iterator; started again
    if it runs out) and return, over the last ``steps``, the mean seconds per step spent waiting for
    the next batch (``next`` and ``prepare``) and computing (forward, backward, optimizer step)."""
    batches = iter(loader)
    waited = computed = 0.0
    for step in range(warmup + steps):
        start = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            batches = iter(loader)
            batch = next(batches)
        images, labels = prepare(batch)
        ready = time.perf_counter()
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        done = time.perf_counter()
        if step >= warmup:
            waited, computed = waited + ready - start, computed + done - ready
    return waited / steps, computed / steps


def measure_data_wait(
    modules: Mapping[str, ImageFolderDataModule],
    steps: int = WAIT_STEPS,
    warmup: int = WAIT_WARMUP,
    passes: int = PASSES,
    threads: int | None = WAIT_THREADS,
) -> dict[str, dict[str, float]]:
    """The training step's wait for data with each folder loader of the DataModule (``modules``:
    :func:`folder_datamodules`; in memory, lazy in the process, lazy in 2 workers): ``passes``
    passes, the loaders in turn, each pass a new epoch iterator of ``warmup`` untimed then ``steps``
    timed steps of the default CNN (``conf/model/cnn.yaml``'s network, SGD with momentum) on the
    batches, normalized by the hook, with ``threads`` intra-op threads (:data:`WAIT_THREADS`;
    None: torch's default, one per core), restored after.

    Returns:
        Per loader, the medians over the passes of ``wait_ms`` (mean milliseconds per step from
        asking for the batch to having it normalized) and ``step_ms`` (mean milliseconds of the
        forward, backward and optimizer step).
    """
    torch.manual_seed(0)
    default_threads = torch.get_num_threads()
    model = CNN(**modules["folder_in_memory"].spec.network_arguments())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loaders = {name: (module.train_dataloader(), hook(module)) for name, module in modules.items()}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in loaders}
    torch.set_num_threads(threads or default_threads)
    try:
        for _ in range(passes):
            for name, (loader, prepare) in loaders.items():
                times[name].append(step_times(loader, prepare, model, optimizer, steps, warmup))
    finally:
        torch.set_num_threads(default_threads)
    return {
        name: {
            "wait_ms": 1000 * statistics.median(wait for wait, _ in values),
            "step_ms": 1000 * statistics.median(step for _, step in values),
        }
        for name, values in times.items()
    }


def measure_folder(
    data_dir: Path,
    cache_dir: Path,
    samples: int | None = None,
    lazy_samples: int = LAZY_SAMPLES,
    steps: int = WAIT_STEPS,
    warmup: int = WAIT_WARMUP,
    passes: int = PASSES,
    val_size: float = VAL_SIZE,
    threads: int | None = WAIT_THREADS,
) -> dict[str, Any]:
    """MNIST's IDX files in ``data_dir/MNIST/raw`` as a PNG folder tree (written once into
    ``cache_dir/mnist-png``, :func:`write_png_tree`), then :func:`measure_folder_pipelines` and
    :func:`measure_data_wait` on it, with the DataModules of :func:`folder_datamodules` (``val_size``
    images of train/ held out; the survey kept in ``cache_dir/folder-survey``).

    Returns:
        ``pipeline`` (samples/s per loader), ``data_wait`` (``wait_ms`` and ``step_ms`` per
        loader), and what they were measured with: ``passes``, ``samples`` (per pass, per loader),
        ``steps``, ``warmup``, ``threads`` (of the training step), ``images`` (in the tree) and
        ``train_images`` (the train split); and the seconds spent writing the tree (``write_s``,
        about 0 when it was reused), setting up the DataModules (``setup_s``: the survey when it
        is not cached, and the decoding into memory) and measuring (``measure_s``).
    """
    cache_dir = Path(cache_dir)
    start = time.perf_counter()
    root = write_png_tree(Path(data_dir) / "MNIST" / "raw", cache_dir / TREE_NAME)
    written = time.perf_counter()
    modules = folder_datamodules(root, cache_dir / SURVEY_NAME, val_size)
    ready = time.perf_counter()
    pipeline = measure_folder_pipelines(modules, samples, lazy_samples, passes)
    wait = measure_data_wait(modules, steps, warmup, passes, threads)
    return {
        "pipeline": pipeline,
        "data_wait": wait,
        "passes": passes,
        "samples": folder_samples(modules, samples, lazy_samples),
        "images": sum(len(split.files) for split in modules["folder_in_memory"].splits.values()),
        "train_images": len(modules["folder_in_memory"].train_set),
        "steps": steps,
        "warmup": warmup,
        "threads": threads or torch.get_num_threads(),
        "write_s": written - start,
        "setup_s": ready - written,
        "measure_s": time.perf_counter() - ready,
    }


FOLDER_NOTES = {
    "folder_in_memory": "`ImageFolderDataModule`, every image decoded into memory at setup, a gather per batch",
    "folder_lazy_0": "`in_memory_limit_mib=0`: each image decoded from its PNG by Pillow when served, `num_workers=0`",
    "folder_lazy_2": "the same in 2 DataLoader workers (persistent)",
    "imagefolder": "torchvision's `ImageFolder`, `Grayscale` / `ToTensor` / `Normalize`, "
    "`DataLoader(shuffle=True, num_workers=2, persistent_workers=True)`",
}


def folder_tables(folder: Mapping[str, Any]) -> str:
    """Markdown: the folder loaders' samples/s with their ratios to ``folder_in_memory``, and the
    training step's data wait, each with a note of what its rows are (``folder``:
    :func:`measure_folder`'s result)."""
    rates, waits, samples = folder["pipeline"], folder["data_wait"], folder["samples"]
    reference = rates["folder_in_memory"]
    rate_rows = "\n".join(
        f"| {name} | {rate:,.0f} | {rate / reference:.3f}x | {samples[name]:,} |" for name, rate in rates.items()
    )
    notes = "\n".join(f"- `{name}`: {note}" for name, note in FOLDER_NOTES.items() if name in rates)
    base_wait = waits["folder_in_memory"]["wait_ms"]
    wait_rows = "\n".join(
        f"| {name} | {w['wait_ms']:.2f} | {w['wait_ms'] / base_wait:,.1f}x | {w['step_ms']:.2f} | "
        f"{w['wait_ms'] / (w['wait_ms'] + w['step_ms']):.0%} |"
        for name, w in waits.items()
    )
    images, train_images, threads = folder["images"], folder["train_images"], folder["threads"]
    return f"""Input pipeline of a folder of images (`data=folder`): MNIST's {images:,} images written once as PNGs
(`train/<digit>/`, `test/<digit>/`; {train_images:,} of train/ to train on), one process, per-device batch 32,
samples/s (median of {folder["passes"]} passes, the loaders in turn; each batch normalized as the model takes it):

| loader | samples/s | vs folder_in_memory | samples per pass |
|---|---|---|---|
{rate_rows}

{notes}

Training step's data wait: per step, the time from asking for the next batch to having it
normalized, when the default CNN's forward, backward and SGD step consume the batches (one process,
batch 32, the step on {threads} intra-op thread{"s" * (threads > 1)}, {folder["steps"]} timed steps per pass after \
{folder["warmup"]} untimed, median of {folder["passes"]} passes):

| loader | data wait per step (ms) | vs folder_in_memory | compute per step (ms) | wait, share of the step |
|---|---|---|---|---|
{wait_rows}
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The input pipelines alone: " + __doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=REPO / "data", help="folder with MNIST/raw/ (default: data)")
    parser.add_argument(
        "--cache", type=Path, default=REPO / "logs" / ".cache" / "benchmarks",
        help="where MNIST is written as PNGs, once (default: logs/.cache/benchmarks)",
    )  # fmt: skip
    parser.add_argument("--samples", type=int, default=None, help="samples per pass of the in-memory loaders")
    parser.add_argument("--folder-samples", type=int, default=LAZY_SAMPLES, help="samples per pass, per-sample loaders")
    parser.add_argument("--wait-steps", type=int, default=WAIT_STEPS, help="timed training steps per data-wait pass")
    parser.add_argument("--passes", type=int, default=PASSES)
    parser.add_argument("--out", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    mnist = measure_input_pipelines(args.data_dir, samples=args.samples, passes=args.passes)
    mnist_s = time.perf_counter() - start
    print("| loader | samples/s | vs PIL path |\n|---|---|---|")
    for name, rate in mnist.items():
        print(f"| {name} | {rate:,.0f} | {rate / mnist['pil']:,.1f}x |")
    folder = measure_folder(
        args.data_dir, args.cache, samples=args.samples, lazy_samples=args.folder_samples, steps=args.wait_steps,
        passes=args.passes,
    )  # fmt: skip
    print(f"\n{folder_tables(folder)}")
    print(
        f"MNIST loaders {mnist_s:.1f} s; PNG tree {folder['write_s']:.1f} s; folder DataModules' setup "
        f"{folder['setup_s']:.1f} s; folder measurements {folder['measure_s']:.1f} s; total "
        f"{time.perf_counter() - start:.1f} s"
    )
    if args.out:
        args.out.write_text(json.dumps({"input_pipeline": mnist, "folder": folder}, indent=2) + "\n")


if __name__ == "__main__":
    main()
