"""Which GPUs a server runs on, as facts a cert can record and a deploy can be held to (pure).

GPU-selection variables (``CUDA_VISIBLE_DEVICES`` and its kin) say *where* a server runs, not
*what* it computes: the same cert should cover a deploy on GPU 0 that was measured on GPU 1 of
the same model. So they are never engine variables; what they selected is recorded instead:
each selected GPU's model, memory, driver and compute capability (``nvidia-smi``'s words),
without its index or UUID, which name one card and not what it computes.

Only ``CUDA_VISIBLE_DEVICES`` is applied here, the way the CUDA runtime reads it: a comma list
of indices or UUID prefixes (``GPU-...``), ending at the first entry that names no GPU; empty or
``-1`` hides every GPU. ``NVIDIA_VISIBLE_DEVICES`` is the container runtime's: inside a
container ``nvidia-smi`` already lists only what it exposed. Selections this module cannot
resolve (a MIG instance, an AMD or Intel selector) leave the placement unread, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "GPU_SELECTION_NAMES",
    "NO_NVIDIA_SMI",
    "GpuDevice",
    "GpuPlacement",
    "PlacementCheck",
    "is_gpu_selection",
    "placement_differences",
    "select_gpus",
    "unread_placement",
]

#: Variables that choose which devices a process sees, read by the CUDA / HIP / oneAPI
#: runtimes, ggml's Vulkan backend or the NVIDIA container runtime (which also reads the
#: capability and requirement variables a CUDA base image sets).
GPU_SELECTION_NAMES = frozenset(
    {
        "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES",
        "NVIDIA_DISABLE_REQUIRE", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL", "ONEAPI_DEVICE_SELECTOR", "ZE_AFFINITY_MASK",
        "GGML_VK_VISIBLE_DEVICES",
    }
)  # fmt: skip
#: ``NVIDIA_REQUIRE_CUDA``, ``NVIDIA_REQUIRE_DRIVER`` ...: the container runtime's checks.
_SELECTION_PREFIXES = ("NVIDIA_REQUIRE_",)
#: Selectors of other vendors: set to anything, the NVIDIA facts no longer say what ran.
_FOREIGN = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
            "ONEAPI_DEVICE_SELECTOR", "ZE_AFFINITY_MASK", "GGML_VK_VISIBLE_DEVICES")  # fmt: skip


#: The source of an empty placement on a host without ``nvidia-smi``.
NO_NVIDIA_SMI = "no nvidia-smi on PATH"


def is_gpu_selection(name: str) -> bool:
    """A variable that selects devices (placement), never recorded as an engine variable."""
    return name in GPU_SELECTION_NAMES or name.startswith(_SELECTION_PREFIXES)


@dataclass(frozen=True, order=True)
class GpuDevice:
    """One GPU as ``nvidia-smi`` lists it (``index`` and ``uuid`` only select it)."""

    name: str
    memory_total_mib: int | None
    driver_version: str
    compute_cap: str
    index: str = ""
    uuid: str = ""

    def record(self) -> dict[str, object]:
        """What a cert keeps: what the card computes with, not which card it was."""
        return {
            "name": self.name,
            "memory_total_mib": self.memory_total_mib,
            "driver_version": self.driver_version,
            "compute_cap": self.compute_cap,
        }


@dataclass(frozen=True)
class GpuPlacement:
    """The GPUs a server with some variables set sees, or why they could not be read."""

    devices: tuple[GpuDevice, ...] = ()
    #: Why the placement is not known (``None``: ``devices`` is the whole selection).
    unread: str | None = None
    #: Where ``devices`` came from: ``nvidia-smi``, or none on this host (no NVIDIA GPU).
    source: str = "nvidia-smi"

    def record(self) -> dict[str, object]:
        """The cert's ``provenance.gpus`` block."""
        if self.unread is not None:
            return {"unread": self.unread}
        return {"source": self.source, "devices": [d.record() for d in sorted(self.devices)]}

    def words(self) -> str:
        if self.unread is not None:
            return f"unread ({self.unread})"
        if not self.devices:
            return "no GPU"
        counts: dict[str, int] = {}
        for device in sorted(self.devices):
            key = (
                f"{device.name} ({device.memory_total_mib} MiB, driver {device.driver_version}, "
                f"compute {device.compute_cap})"
            )
            counts[key] = counts.get(key, 0) + 1
        return " + ".join(f"{n} x {key}" for key, n in counts.items())


def unread_placement(why: str) -> GpuPlacement:
    return GpuPlacement(unread=why)


def _pick(devices: Sequence[GpuDevice], entry: str) -> GpuDevice | None:
    if entry.isdigit():
        return next((d for d in devices if d.index == entry), None)
    if entry.startswith("GPU-"):
        matches = [d for d in devices if d.uuid.startswith(entry)]
        return matches[0] if len(matches) == 1 else None
    return None


def select_gpus(listed: Sequence[GpuDevice] | None, env: Mapping[str, str]) -> GpuPlacement:
    """The GPUs a process with ``env`` sees among ``listed`` (``None``: no working
    ``nvidia-smi``, which on a host with no NVIDIA driver means no NVIDIA GPU is used)."""
    foreign = sorted(name for name in _FOREIGN if name in env)
    if foreign:
        return unread_placement(f"{', '.join(foreign)} selects devices nvidia-smi cannot name")
    if listed is None:
        return GpuPlacement(source=NO_NVIDIA_SMI)
    chosen = env.get("CUDA_VISIBLE_DEVICES")
    if chosen is None:
        return GpuPlacement(tuple(listed))
    picked: list[GpuDevice] = []
    for raw in chosen.split(","):
        entry = raw.strip()
        if entry.startswith("MIG-"):
            return unread_placement(f"CUDA_VISIBLE_DEVICES={chosen} selects a MIG instance")
        device = _pick(listed, entry)
        if device is None or device in picked:
            break  # the CUDA runtime stops at the first entry that names no (new) device
        picked.append(device)
    return GpuPlacement(tuple(picked))


def _recorded(block: Mapping[str, object]) -> GpuPlacement:
    """A cert's ``provenance.gpus`` read back (anything unexpected reads as unread)."""
    if "unread" in block:
        return unread_placement(str(block["unread"]))
    devices = block.get("devices")
    if not isinstance(devices, list):
        return unread_placement("the cert's GPU record has no device list")
    out: list[GpuDevice] = []
    for item in devices:
        if not isinstance(item, dict):
            return unread_placement("the cert's GPU record holds a device that is no object")
        memory = item.get("memory_total_mib")
        out.append(
            GpuDevice(
                name=str(item.get("name", "")),
                memory_total_mib=memory if isinstance(memory, int) else None,
                driver_version=str(item.get("driver_version", "")),
                compute_cap=str(item.get("compute_cap", "")),
            )
        )
    return GpuPlacement(tuple(out))


def _facts(device: GpuDevice) -> tuple[str, int, str, str]:
    memory = -1 if device.memory_total_mib is None else device.memory_total_mib
    return (device.name, memory, device.driver_version, device.compute_cap)


@dataclass(frozen=True)
class PlacementCheck:
    """A deploy's GPUs against a cert's: the differences, or why it was not checked."""

    differences: tuple[str, ...] = ()
    #: Said on the pass line: what could not be compared and why (``None``: compared).
    unchecked: str | None = None


def placement_differences(
    recorded: Mapping[str, object] | None, here: GpuPlacement
) -> PlacementCheck:
    """Compare the GPUs a cert measured on (its ``provenance.gpus``) with the ones a deploy
    selects on this host. Different facts are a difference; what is unread on either side is
    said, not guessed."""
    if recorded is None:
        return PlacementCheck(
            unchecked="GPU placement not checked: the cert does not record its GPUs"
        )
    measured = _recorded(recorded)
    if measured.unread is not None:
        return PlacementCheck(unchecked=f"GPU placement not checked: the cert's {measured.words()}")
    if here.unread is not None:
        return PlacementCheck(unchecked=f"GPU placement not checked: this host's {here.words()}")
    if sorted(map(_facts, here.devices)) == sorted(map(_facts, measured.devices)):
        return PlacementCheck()
    return PlacementCheck(
        differences=(f"GPUs {here.words()} (measured on {measured.words()})",),
    )
