"""What a machine offers a job: its CUDA GPUs, the installed versions of the packages an engine
needs and the command-line tools a run may start (nsys), found without importing torch or
megatron-core (the planning process stays light).

``probe()`` describes this machine: GPUs come from the CUDA driver API through ctypes (it honours
CUDA_VISIBLE_DEVICES, as torch does); versions from the installed distributions' metadata.
``preset_machine(gpu, release)`` describes one node of the cluster a ``gpu=`` preset was written
for, so that a plan made on a laptop judges the job for that cluster. The environment rules of the
catalogue judge a job against these facts, in ``mode=plan`` and again before a run starts.
"""

import ctypes
import importlib.metadata
import importlib.util
import os
import random
import re
import shutil
import socket
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

from omegaconf import OmegaConf

from bridge.config.paths import config_dir
from bridge.config.releases import release as table_row

# The packages whose versions the rules read: name -> (distribution, module it provides). For
# Transformer Engine that is its PyTorch extension: without it TE does not import in torch.
PACKAGES = {
    "torch": ("torch", "torch"),
    "megatron-core": ("megatron-core", "megatron.core"),
    "transformer-engine": ("transformer-engine-torch", "transformer_engine_torch"),
    # TE's Python package alone: megatron-core imports it whenever it is there, and without the extension
    # above that import fails (FileNotFoundError), so megatron-core does not import at all.
    "transformer-engine-python": ("transformer-engine", "transformer_engine"),
    "apex": ("apex", "apex"),
    # Compiled kernels megatron-core imports by module name when a fusion asks for them (no distribution of
    # their own: apex, or Megatron-LM's fused kernels, installs them).
    "apex-fused-weight-gradient": ("fused_weight_gradient_mlp_cuda", "fused_weight_gradient_mlp_cuda"),
    "fused-softmax": ("scaled_masked_softmax_cuda", "scaled_masked_softmax_cuda"),
    # The CUTLASS grouped GEMM of megatron-core 0.16.1's legacy GroupedMLP (github.com/fanshiqing/grouped_gemm).
    "grouped-gemm": ("grouped_gemm", "grouped_gemm"),
}
TOOLS = ("nsys",)
"""Programs a run may start the training process under (perf.nsys), looked up on PATH."""
# CUdevice_attribute values of the compute capability.
COMPUTE_CAPABILITY_MAJOR, COMPUTE_CAPABILITY_MINOR = 75, 76


@dataclass(frozen=True)
class GPU:
    name: str
    capability: Tuple[int, int]
    memory_bytes: Optional[int] = None
    """Total device memory (cuDeviceTotalMem), for the plan's memory estimate."""


@dataclass(frozen=True)
class Machine:
    gpus: Tuple[GPU, ...] = ()
    packages: Dict[str, Optional[str]] = field(default_factory=dict)
    """Package name (see PACKAGES) -> installed version, or None when it is not installed."""
    tools: Dict[str, Optional[str]] = field(default_factory=dict)
    """Tool name (see TOOLS) -> its path on PATH, or None when it is not there."""

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def version(self, package: str) -> Optional[str]:
        return self.packages.get(package)

    def has(self, package: str) -> bool:
        return self.packages.get(package) is not None

    def describe(self) -> str:
        gpus = f"{self.gpu_count} x {self.gpus[0].name}" if self.gpus else "no CUDA GPU"
        installed = ", ".join(name if version == "unknown" else f"{name} {version}"
                              for name, version in self.packages.items() if version)
        return f"{gpus}; {installed or 'none of torch, megatron-core, transformer-engine'}"

    def has_gpu_kind(self, kind: str) -> bool:
        """Whether a GPU here is of the preset kind ``kind`` (h100, gb200, ...)."""
        return any(gpu_kind(gpu.name) == kind for gpu in self.gpus)


@dataclass(frozen=True)
class PresetGPU:
    name: str
    capability: Tuple[int, int]
    memory_gb: int
    """Device memory in GB (10^9 bytes), as NVIDIA specifies it."""


PRESET_GPUS = {
    "h100": PresetGPU("NVIDIA H100", (9, 0), 80),
    "h200": PresetGPU("NVIDIA H200", (9, 0), 141),
    "b200": PresetGPU("NVIDIA B200", (10, 0), 180),
    "gb200": PresetGPU("NVIDIA GB200", (10, 0), 186),
    "b300": PresetGPU("NVIDIA B300", (10, 0), 288),
    "gb300": PresetGPU("NVIDIA GB300", (10, 0), 288),
}
"""The GPUs Bridge writes presets for (conf/gpu/), by the name gpu= gives them."""


def gpu_kind(device_name: str) -> Optional[str]:
    """The preset kind of a GPU the driver names (``NVIDIA H100 80GB HBM3`` -> h100), else None.
    Whole words only: a GB200 is no B200."""
    words = re.findall(r"[a-z0-9]+", device_name.lower())
    return next((kind for kind in PRESET_GPUS if kind in words), None)


def preset_gpus_per_node(kind: str) -> int:
    """GPUs in one node of the preset GPU's machine: conf/gpu/<kind>.yaml's workload.gpus_per_node."""
    return OmegaConf.load(config_dir() / "gpu" / f"{kind}.yaml").workload.gpus_per_node


def preset_machine(gpu: str, megatron_core: str) -> Machine:
    """One node of the cluster a ``gpu=`` preset is written for (``gpu``: a key of PRESET_GPUS), set up
    for megatron-core release ``megatron_core``: its GPUs, that release with the newest Transformer
    Engine the GPU record tested it with (bridge.config.releases), torch of a version not known
    here, apex with its compiled kernels and Nsight Systems (the NGC containers Bridge runs in ship both), and
    grouped_gemm (Megatron-Bridge 0.3.1 requires megatron-core[dev,mlm], whose dev extra brings nv-grouped-gemm)."""
    preset = PRESET_GPUS[gpu]
    row = table_row(megatron_core)
    engine = row.tested_transformer_engine[-1] if row and row.tested_transformer_engine else None
    node = tuple(GPU(preset.name, preset.capability, preset.memory_gb * 10 ** 9)
                 for _ in range(preset_gpus_per_node(gpu)))
    shipped = {name: "unknown" for name in ("apex", "apex-fused-weight-gradient", "fused-softmax", "grouped-gemm")}
    return Machine(gpus=node, packages={"torch": "unknown", "megatron-core": megatron_core,
                                        "transformer-engine": engine, **shipped},
                   tools={name: name for name in TOOLS})


@lru_cache(maxsize=1)
def probe() -> Machine:
    """This machine's facts, looked up once per process."""
    return Machine(gpus=cuda_gpus(), packages={name: installed_version(name) for name in PACKAGES},
                   tools={name: shutil.which(name) for name in TOOLS})


def installed_version(package: str) -> Optional[str]:
    distribution, module = PACKAGES[package]
    try:
        return release(importlib.metadata.version(distribution))
    except importlib.metadata.PackageNotFoundError:
        pass
    # Importable without distribution metadata (a source checkout on PYTHONPATH): version unknown.
    try:
        return "unknown" if importlib.util.find_spec(module) is not None else None
    except (ImportError, ValueError):  # find_spec of a submodule whose parent package is missing
        return None


def release(version: str) -> str:
    """``2.10.0+cu130`` -> ``2.10.0``; what version rules compare."""
    return version.split("+")[0]


def cuda_gpus() -> Tuple[GPU, ...]:
    driver = _load_driver()
    if driver is None or driver.cuInit(0) != 0:
        return ()
    count = ctypes.c_int()
    if driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return ()
    return tuple(_gpu(driver, index) for index in range(count.value))


def _load_driver():
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _gpu(driver, index: int) -> GPU:
    device, name = ctypes.c_int(), ctypes.create_string_buffer(256)
    major, minor, memory = ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t()
    driver.cuDeviceGet(ctypes.byref(device), index)
    driver.cuDeviceGetName(name, len(name), device)
    driver.cuDeviceGetAttribute(ctypes.byref(major), COMPUTE_CAPABILITY_MAJOR, device)
    driver.cuDeviceGetAttribute(ctypes.byref(minor), COMPUTE_CAPABILITY_MINOR, device)
    known = driver.cuDeviceTotalMem_v2(ctypes.byref(memory), device) == 0
    return GPU(name.value.decode(errors="replace"), (major.value, minor.value), memory.value if known else None)


CPUINFO = Path("/proc/cpuinfo")


def host_cpu(cpuinfo: Path = CPUINFO) -> Optional[str]:
    """The host's processor and how many logical CPUs this process sees, for records whose steps or runs the host
    bounds (MoE proxies, the differential's runs): their times move with it. None where the kernel says nothing."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), None)
    seen = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {seen} CPUs" if model else None


def stolen_s(stat: Path = Path("/proc/stat")) -> Optional[float]:
    """Seconds the hypervisor has run others on this machine's CPUs since boot (steal, summed over CPUs): what a
    virtual machine's neighbours take from a host-bound run. None where the kernel does not say."""
    try:
        fields = stat.read_text().splitlines()[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") if fields[0] == "cpu" and len(fields) > 8 else None
    except (OSError, ValueError, IndexError):
        return None


def cpu_list(text: str) -> Set[int]:
    """The CPUs a kernel CPU list names ("0-15,32-47", as /sys and taskset write them)."""
    cpus = set()
    for part in filter(None, text.strip().split(",")):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""The ports Linux gives outgoing connections (NCCL's, TCPStore clients'), one of which may take a port found free
before the rendezvous server binds it: EADDRINUSE on port 39111 for a one-process run beside three differentials
(H200, c236fc3), and on 39632 for a multigpu test's torchrun (2026-11-27)."""
RENDEZVOUS_SPAN = 8192
"""How many ports just below the ephemeral range free_ports draws from."""


def ephemeral_ports(path: Path = EPHEMERAL_PORTS) -> Optional[Tuple[int, int]]:
    """The kernel's ephemeral port range (first, last), or None where it says none (not Linux)."""
    try:
        first, last = map(int, path.read_text().split())
    except (OSError, ValueError):
        return None
    return first, last


def free_port() -> int:
    """A TCP port free on this machine now, for a process group's rendezvous."""
    return free_ports(1)[0]


def free_ports(count: int, ephemeral: Path = EPHEMERAL_PORTS) -> List[int]:
    """``count`` different TCP ports free on this machine now, for process groups that start together: drawn at
    random from below the kernel's ephemeral range, where no outgoing connection takes one before its group binds
    it (the kernel's own pick where the range is unknown or nothing there is free). Each is held while the next is
    found, so that none comes twice."""
    span = ephemeral_ports(ephemeral)
    candidates = list(range(max(1024, span[0] - RENDEZVOUS_SPAN), span[0])) if span else []
    random.SystemRandom().shuffle(candidates)  # not the global generator, which seeds a run
    ports: List[int] = []
    with ExitStack() as held:
        for port in candidates + [0] * count:
            if len(ports) == count:
                break
            probe = held.enter_context(socket.socket())
            try:
                probe.bind(("", port))
            except OSError:
                continue
            ports.append(probe.getsockname()[1])
    return ports
