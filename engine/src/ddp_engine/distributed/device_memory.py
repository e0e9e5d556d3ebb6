"""The memory of the GPUs a plan may name (``plan.device=h100``), so that a user who knows the card
need not look its size up: the one table of them. Sizes are the makers' (GiB as they state them;
the driver reports a few hundred MiB less, which the CUDA context takes anyway)."""

from ddp_engine.core.errors import ConfigValueError

#: Memory per device, GiB, by the name ``plan.device`` takes (lower case).
DEVICE_MEMORY_GIB = {
    "h200": 141,
    "h100": 80,
    "h100-nvl": 94,
    "a100-80gb": 80,
    "a100-40gb": 40,
    "l40s": 48,
    "a10g": 24,
    "l4": 24,
    "v100-32gb": 32,
    "v100-16gb": 16,
    "t4": 16,
}
#: Short names of cards sold in one size (an A100 or a V100 comes in two: named with its size).
DEVICE_ALIASES = {"a10": "a10g"}


def device_memory_gib(device: str | None, memory_gib: float | None) -> float | None:
    """The memory of one device of the plan, GiB: ``plan.device_memory_gib`` (``memory_gib``) when
    given, else the size of the named ``device`` (:data:`DEVICE_MEMORY_GIB`), else None (not known).

    Raises:
        ConfigValueError: for a size that is not positive, or a device name not in the table.
    """
    if memory_gib is not None:
        if not memory_gib > 0:
            raise ConfigValueError(f"plan.device_memory_gib={memory_gib} must be a positive size in GiB.")
        return float(memory_gib)
    if device is None:
        return None
    name = DEVICE_ALIASES.get(device.lower(), device.lower())
    if name not in DEVICE_MEMORY_GIB:
        known = ", ".join(sorted([*DEVICE_MEMORY_GIB, *DEVICE_ALIASES]))
        raise ConfigValueError(
            f"plan.device={device} is not a device whose memory is known ({known}): give its size instead, "
            "plan.device_memory_gib=<GiB>."
        )
    return float(DEVICE_MEMORY_GIB[name])
