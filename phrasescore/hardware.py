"""The machine: which device and precision a job runs on, its threads, its processor and its
measured matrix-multiply rate.

Every job picks its device with :func:`resolve_device` and its threads with :func:`set_threads`;
the scoring engine asks :func:`resolve_dtype` for ``--dtype auto``. ``/proc/cpuinfo`` is read in
one place, :func:`cpu_info`.

Benchmarks report throughput as a fraction of the peak measured *in the same run*: the 2-core
machines differ (Intel with AMX, AMD EPYC with AVX-512 BF16) and their load changes, so a figure
measured elsewhere or earlier would not compare.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import resource
import time

import torch

from phrasescore.errors import InputError

BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
"""CPU flags of native bf16 matrix units."""
REPORTED_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f")


# ---------------------------------------------------------------------------- device and threads
DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"
_DEVICE_NAME = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def valid_device_name(name: str) -> bool:
    """True for the names :func:`resolve_device` takes (:data:`DEVICE_CHOICES`)."""
    return _DEVICE_NAME.fullmatch(name) is not None


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when available, else CPU."""
    if not valid_device_name(name):
        raise InputError(f"unknown device {name!r} (one of {DEVICE_CHOICES})")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {name} was asked for, but PyTorch sees no CUDA device")
    device = torch.device(name)
    if device.type == "cuda" and device.index is not None:
        count = torch.cuda.device_count()
        if device.index >= count:
            raise InputError(
                f"--device {name} was asked for, but PyTorch sees {count} CUDA device(s) "
                f"(cuda:0 to cuda:{count - 1})"
            )
    return device


def deterministic_kernels(device: torch.device) -> None:
    """On CUDA, kernels that give the same bytes for the same inputs and seed: cuBLAS with a
    fixed workspace (``CUBLAS_WORKSPACE_CONFIG``, read when its handle is made: call this before
    the first matrix product), cuDNN's deterministic algorithms, and PyTorch's deterministic
    scatter/index kernels (the embeddings' gradients), at some cost in speed. The CPU kernels
    are deterministic for a given thread count already.

    Not PyTorch's filling of every new tensor's memory that deterministic mode turns on with
    them (``torch.utils.deterministic.fill_uninitialized_memory``: NaN in each ``empty``): it
    changes no result of code that never reads memory it has not written, and it is one more
    kernel per allocation, a large share of a training step's launches (docs/benchmarks.md,
    "the engine and the trainer measured")."""
    if device.type != "cuda":
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        import torch.utils.deterministic as fill  # noqa: PLC0415 - PyTorch >= 2.1
    except ImportError:
        return
    fill.fill_uninitialized_memory = False


def set_threads(threads: int | None) -> None:
    """Use ``threads`` CPU threads in PyTorch (None or 0: PyTorch's default)."""
    if threads:
        torch.set_num_threads(threads)


def native_bf16(device: torch.device) -> bool:
    """True where bf16 matrix products run natively: CUDA, or a CPU with AVX-512 BF16 or AMX."""
    if device.type == "cuda":
        return True
    return bool(cpu_info()[1] & BF16_FLAGS)


def resolve_dtype(name: str, device: torch.device) -> str:
    """``auto``: bfloat16 where it is native (see :func:`native_bf16`), else float32."""
    if name != "auto":
        return name
    return "bfloat16" if native_bf16(device) else "float32"


# ---------------------------------------------------------------------------- the processor
@functools.lru_cache(maxsize=1)
def cpu_info() -> tuple[str | None, frozenset[str]]:
    """(model name, flags) of the first processor in ``/proc/cpuinfo``; (None, {}) without one."""
    name: str | None = None
    flags: frozenset[str] | None = None
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if name is None and line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                elif flags is None and line.startswith("flags"):
                    flags = frozenset(line.split(":", 1)[1].split())
                if name is not None and flags is not None:
                    break
    except OSError:
        pass
    return name, flags or frozenset()


def describe_processor() -> str:
    """Model name, core count and PyTorch's CPU capability (e.g. ``AVX512``, ``AMX``)."""
    name, have = cpu_info()
    name = name or platform.processor() or "unknown"
    flags = " ".join(f for f in REPORTED_FLAGS if f in have)
    capability = torch.backends.cpu.get_cpu_capability()
    return (
        f"{name}, {torch.get_num_threads()} threads, torch {torch.__version__} "
        f"capability {capability}" + (f", flags {flags}" if flags else "")
    )


def matmul_rate(
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    size: int = 2048,
    seconds: float = 1.5,
    cpu_seconds: bool = False,
) -> float:
    """Sustained FLOP/s of square ``size`` x ``size`` matrix products in ``dtype``; with
    ``cpu_seconds`` (CPU only) per second of this process's CPU time, which other processes on a
    shared machine slow much less than wall time (for rates that are per CPU-second too)."""
    clock = time.process_time if cpu_seconds else time.perf_counter
    dev = torch.device(device)
    a = torch.randn(size, size, device=dev).to(dtype)
    b = torch.randn(size, size, device=dev).to(dtype)
    for _ in range(2):
        torch.mm(a, b)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    count = 0
    started = clock()
    while True:
        torch.mm(a, b)
        count += 1
        if count % 4 == 0:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if clock() - started >= seconds:
                break
    elapsed = clock() - started
    return 2.0 * size**3 * count / elapsed


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
