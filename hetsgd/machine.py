"""Facts about this machine that configs, summaries and the monitor need: cores, memory, CPU
model, GPUs, and when this process started.

GPUs are found through NVML (the ``nvidia-ml-py`` package, module ``pynvml``), never through
CUDA, so the coordinator stays free of a CUDA context; torch is imported only to ask whether the
installed build has CUDA at all. This module sits below every other one: of the project it
imports only ``errors``.

``HETSGD_CORES=n`` makes this machine report n usable cores, for tests only: the suite runs
with ``HETSGD_CORES=16`` on a 2-core machine to show that no test depends on the core count of
the machine it runs on (every test pins its worker counts).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import platform
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil

from hetsgd.errors import UserError

try:
    import pynvml
except ImportError:  # nvidia-ml-py is a dependency, but without it there are simply no GPUs
    pynvml = None


#: Test-only: the core count to report instead of this machine's (see the module's docstring).
CORES_OVERRIDE = "HETSGD_CORES"


def usable_cores() -> int:
    """Cores this process may run on: its affinity mask, no more than its container's CPU quota
    allows (whole cores, at least one; a quota leaves the mask as it is), or ``$HETSGD_CORES``
    where a test sets it."""
    override = os.environ.get(CORES_OVERRIDE)
    if override is not None:
        if not override.strip().isdigit() or int(override) < 1:
            raise UserError(f"{CORES_OVERRIDE}={override!r} is not a positive whole number")
        return int(override)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    return cores if quota is None else min(cores, max(1, math.floor(quota)))


def available_memory() -> int:
    """Bytes that new processes can take without swapping (the kernel's estimate, page cache
    that can be dropped included)."""
    return int(psutil.virtual_memory().available)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def process_started_at() -> float:
    """When this process started, on the wall clock (``time.time()``). psutil's ``create_time``
    adds the boot time that ``/proc/stat`` gives in whole seconds, up to a second off (0.82 s
    on one development VM), as much as a run's cost before training that it dates. On Linux
    the start is read in clock ticks since boot and set against ``CLOCK_BOOTTIME`` instead."""
    try:
        with open("/proc/self/stat") as f:
            # field 22, starttime; the command name before it, in parentheses, may hold spaces
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):  # not Linux
        return psutil.Process().create_time()
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - since_boot


@contextmanager
def nvml() -> Iterator[list[Any]]:
    """NVML device handles for the duration of the block; none when NVML is missing or fails."""
    if pynvml is None:
        yield []
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        yield []
        return
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                   for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError:
        handles = []
    try:
        yield handles
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    # Older NVML bindings return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else value


def _describe(handle: Any, nvml_index: int, driver: str) -> dict[str, Any]:
    return {"name": _text(pynvml.nvmlDeviceGetName(handle)),
            "memory_mb": pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20,
            "driver": driver,
            "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
            "pci_bus_id": _text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
            "nvml_index": nvml_index}


def describe_gpus() -> list[dict[str, Any]]:
    """Every GPU NVML sees, in NVML's order: name, total memory (MB), driver version, ``uuid``
    (``GPU-...``), ``pci_bus_id`` and ``nvml_index``; empty without NVML."""
    with nvml() as handles:
        if not handles:
            return []
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        return [_describe(h, i, driver) for i, h in enumerate(handles)]


def _leading_int(entry: str) -> int:
    """The number an entry starts with, as CUDA's strtoul reads it (``1gpu`` is 1); -1 if none."""
    match = re.match(r"[+-]?\d+", entry)
    return int(match.group()) if match else -1


def visible_nvml_indices(visible: str | None, uuids: list[str]) -> list[int]:
    """NVML indices of the GPUs CUDA enumerates under ``CUDA_VISIBLE_DEVICES=visible``, in
    CUDA's order (torch's ``cuda:i`` is the i-th), given the UUIDs of NVML's GPUs in NVML order.

    Read as CUDA and torch read it: a comma-separated list of indices (``1,3``) or of ``GPU-``
    UUIDs or unambiguous prefixes of them; the list ends at the first entry that names no GPU
    (a negative or out-of-range index, an unknown or ambiguous UUID, a ``MIG-`` device, which
    NVML's GPU list cannot map); a GPU named twice makes the whole list empty. Unset means every
    GPU; empty or ``-1`` means none. Indices are taken in NVML's (PCI bus) order, which is
    CUDA's with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and on machines of one GPU model.
    """
    if visible is None:
        return list(range(len(uuids)))
    picked: list[int] = []
    for raw in visible.split(","):
        entry = raw.strip()
        if entry.startswith("GPU-"):
            matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(entry)]
            index = matches[0] if len(matches) == 1 else -1
        else:
            index = _leading_int(entry)
        if index < 0 or index >= len(uuids):
            break
        if index in picked:
            return []
        picked.append(index)
    return picked


def cuda_devices() -> list[dict[str, Any]]:
    """The GPUs this torch build can use, in torch's order: entry i is ``cuda:i``.

    Those NVML sees, filtered and ordered by ``CUDA_VISIBLE_DEVICES``
    (:func:`visible_nvml_indices`), each as :func:`describe_gpus` gives it (``nvml_index`` is
    its NVML index, not the torch one); none when torch was built without CUDA. CUDA itself is
    never initialised.
    """
    import torch  # the config layer asks this through resolvers: keep torch off its import path

    if torch.version.cuda is None:
        return []
    if pynvml is None:
        _say_no_bindings()
    gpus = describe_gpus()
    order = visible_nvml_indices(os.environ.get("CUDA_VISIBLE_DEVICES"),
                                 [gpu["uuid"] for gpu in gpus])
    return [gpus[i] for i in order]


@functools.cache
def _say_no_bindings() -> None:
    """Once a process: a CUDA build of torch without NVML's bindings would run every GPU mix as
    the emulated one, a fallback the user must hear of (without a driver, NVML's own absence
    is no news)."""
    logging.getLogger("hetsgd").warning(
        "this torch build has CUDA, but nvidia-ml-py (module pynvml) is not installed: hetsgd "
        "finds GPUs through NVML and sees none here (pip install nvidia-ml-py)")


CGROUP_ROOT = "/sys/fs/cgroup"


def _ranges(cpus: set[int]) -> str:
    """CPU numbers as the kernel lists them (``0-3,8``): a 192-core mask stays one short line."""
    spans: list[list[int]] = []
    for cpu in sorted(cpus):
        if spans and cpu == spans[-1][1] + 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def cgroup_cpu_limit(root: str = CGROUP_ROOT) -> float | None:
    """The cores this process's cgroup (v2) and its ancestors may use, the tightest
    ``cpu.max`` quota over period on the way up; None where none is set or none is readable
    (cgroup v1, not Linux): a container's limit throttles its workers below their threads."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next(line.split("::", 1)[1].strip() for line in f if line.startswith("0::"))
    except (OSError, StopIteration):
        return None
    limits = []
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), -1, -1):
        try:
            with open(os.path.join(root, *parts[:depth], "cpu.max")) as f:
                quota, period = f.read().split()[:2]
        except (OSError, ValueError):
            continue
        if quota != "max":
            limits.append(int(quota) / int(period))
    return min(limits) if limits else None


def cpu_sharing() -> dict[str, Any]:
    """The machine facts that explain contention: hardware threads per core (two on an SMT
    machine, whose sibling threads share a core's units), the CPUs this process may run on
    (``taskset``, a container's cpuset) and the cgroup's CPU limit (None: none set or readable)."""
    physical = psutil.cpu_count(logical=False)
    logical = psutil.cpu_count(logical=True)
    try:
        affinity: str | None = _ranges(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        affinity = None
    return {"threads_per_core": logical / physical if physical and logical else None,
            "affinity": affinity, "cgroup_cpu_limit": cgroup_cpu_limit()}


def machine_facts() -> dict[str, Any]:
    """What `hetsgd machine` lists: the CPU, its cores, and the GPUs torch can use here."""
    import torch

    return {"cpu_model": cpu_model(), "cores": usable_cores(), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "gpus": cuda_devices()}
