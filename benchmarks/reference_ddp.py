"""The reference: the DDP training program a user would write by hand, without the template.

    torchrun --standalone --nproc-per-node=2 benchmarks/reference_ddp.py --data-dir DIR --seed 1 --out ref.json

The same work as the template's default recipe (``python -m mnist_ddp.train``), in plain torch:
the same CNN (5x5 convs of 24 and 32 channels, hidden 256), the same 55,000 / 5,000
train/val split of the MNIST training images (split seed 0), held in memory and normalized with
the same statistics, the net's weights and activations channels-last, global batch 128 over the
processes, cross-entropy with label smoothing 0.1,
AdamW (lr 0.01, weight decay 0.01) under a one-cycle schedule stepped per optimizer step, one
epoch; then accuracy on the validation split and the 10,000 test images, and the weights saved
once by rank 0.

It imports nothing from ``mnist_ddp`` (that would bring in Lightning), so its start-up is that
of a hand-written program. With CUDA it runs one process per GPU over NCCL, as the template does;
``--bf16`` and ``--compile`` then match ``experiment=fast_gpu`` (bf16 autocast, ``torch.compile``).
Global rank 0 writes its timings to ``--out`` (JSON):

- ``first_step_unix``: when the first batch's forward pass started (Unix time, seconds);
- ``train_loop_s``: from then to the end of the last optimizer step (seconds, rank 0's clock);
- ``train_samples``: training samples over all processes in that time;
- ``batch_starts_s``: when each batch's forward pass started, in seconds after the first;
- ``val_acc``, ``test_acc``; ``peak_rss_mib``: every rank's peak resident set size (MiB).
"""

import argparse
import json
import os
import resource
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset, default_convert
from torchvision.datasets import MNIST

MEAN, STD = 0.1307, 0.3081  # over the 60,000 MNIST training images (PyTorch's examples/mnist)


def make_model(name: str = "cnn") -> nn.Module:
    """(N, 1, 28, 28) -> (N, 10) logits. ``cnn``: the template's default ``CNN()`` (``conf/model/cnn.yaml``);
    ``tiny``: Flatten + Linear 784 -> 10, the template's
    ``model=mlp model.net.hidden=[] model.net.dropout=0``, too small to hide any per-step cost."""
    if name == "tiny":
        return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10))
    return nn.Sequential(
        nn.Conv2d(1, 24, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(24, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 256), nn.ReLU(), nn.Dropout(0.0), nn.Linear(256, 10),
    )  # fmt: skip


class GatherSet(TensorDataset):
    """A batch as one index gather, ``(images[indices], labels[indices])``: the template's data path
    (``mnist_ddp.data.GatherDataset``; a DataLoader over it takes
    ``collate_fn=default_convert``), instead of one ``dataset[i]`` per sample and a collate."""

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        index = torch.as_tensor(indices, dtype=torch.int64)
        return tuple(tensor[index] for tensor in self.tensors)


def load(data_dir: str, train: bool) -> TensorDataset:
    split = MNIST(data_dir, train=train, download=False)
    return TensorDataset((split.data.unsqueeze(1).float() / 255 - MEAN) / STD, split.targets)


@torch.no_grad()
def accuracy(model: nn.Module, dataset: TensorDataset, batch_size: int, device: torch.device) -> float:
    """Correct predictions over all ranks / samples; each rank scores its own contiguous slice."""
    model.eval()
    rank, world = dist.get_rank(), dist.get_world_size()
    images, labels = (t.tensor_split(world)[rank].to(device) for t in dataset.tensors)
    correct = sum((model(x).argmax(1) == y).sum() for x, y in zip(images.split(batch_size), labels.split(batch_size)))
    counts = torch.tensor([float(correct), float(len(labels))], device=device)
    dist.all_reduce(counts)
    return (counts[0] / counts[1]).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="folder with MNIST/raw/<four IDX files>")
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--global-batch-size", type=int, default=128)
    parser.add_argument("--label-smoothing", type=float, default=0.1)
    parser.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--limit-train-batches", type=int, default=None, help="stop each epoch early (smoke test)")
    parser.add_argument("--out", required=True, help="JSON file for rank 0's figures")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--model", choices=["cnn", "tiny"], default="cnn", help="see make_model (default cnn)")
    parser.add_argument("--gather", action="store_true", help="batches as one index gather (GatherSet)")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    full = load(args.data_dir, train=True)
    order = torch.randperm(len(full), generator=torch.Generator().manual_seed(0))
    val_set = TensorDataset(*(t[order[:5000]] for t in full.tensors))
    train_set = TensorDataset(*(t[order[5000:]] for t in full.tensors))
    test_set = load(args.data_dir, train=False)

    batch_size = args.global_batch_size // world
    sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed, drop_last=True)
    if args.gather:
        loader = DataLoader(GatherSet(*train_set.tensors), batch_size, sampler=sampler, collate_fn=default_convert)
    else:
        loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    steps_per_epoch = min(len(loader), args.limit_train_batches or len(loader))

    net = make_model(args.model).to(device)
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    net.to(memory_format=memory_format)
    if args.compile:
        net.compile()
    model = DistributedDataParallel(net, device_ids=[device] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.01, total_steps=steps_per_epoch * args.epochs)

    first_step = first_step_unix = None
    samples, batch_starts = 0, []
    for epoch in range(args.epochs):
        model.train()
        sampler.set_epoch(epoch)
        for step, (images, labels) in enumerate(loader):
            if step == steps_per_epoch:
                break
            images = images.to(device, non_blocking=True).contiguous(memory_format=memory_format)
            labels = labels.to(device, non_blocking=True)
            now = time.perf_counter()
            if first_step is None:
                first_step, first_step_unix = now, time.time()
            batch_starts.append(now - first_step)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                loss = F.cross_entropy(model(images), labels, label_smoothing=args.label_smoothing)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            samples += len(labels) * world
        if cuda:
            torch.cuda.synchronize(device)
        train_loop_s = time.perf_counter() - first_step
        print(f"rank {rank} epoch {epoch}: loss {loss.item():.4f}, {train_loop_s:.1f} s", flush=True)

    val_acc = accuracy(model.module, val_set, 1000, device)
    test_acc = accuracy(model.module, test_set, 1000, device)
    peak_rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0], device=device)  # KiB->MiB
    all_rss = [torch.zeros(1, device=device) for _ in range(world)]
    dist.all_gather(all_rss, peak_rss)
    if rank == 0:
        torch.save(model.module.state_dict(), os.path.join(os.path.dirname(os.path.abspath(args.out)), "model.pt"))
        figures = {
            "first_step_unix": first_step_unix,
            "train_loop_s": train_loop_s,
            "train_samples": samples,
            "batch_starts_s": batch_starts,
            "val_acc": val_acc,
            "test_acc": test_acc,
            "peak_rss_mib": [t.item() for t in all_rss],
        }
        with open(args.out, "w") as f:
            json.dump(figures, f, indent=2)
        print(f"test accuracy {test_acc:.4f}, val accuracy {val_acc:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
