"""What the machine can do: its processor and its measured matrix-multiply rate.

Benchmarks report throughput as a fraction of the peak measured *in the same run*: the 2-core
machines differ (Intel with AMX, AMD EPYC with AVX-512 BF16) and their load changes, so a figure
measured elsewhere or earlier would not compare.
"""

from __future__ import annotations

import platform
import resource
import time

import torch


def describe_processor() -> str:
    """Model name, core count and PyTorch's CPU capability (e.g. ``AVX512``, ``AMX``)."""
    name = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    flags = ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    flags = " ".join(
                        f for f in ("avx512_bf16", "amx_bf16", "amx_tile", "avx512f") if f in have
                    )
                    break
    except OSError:
        pass
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
) -> float:
    """Sustained FLOP/s of square ``size`` x ``size`` matrix products in ``dtype``."""
    dev = torch.device(device)
    a = torch.randn(size, size, device=dev).to(dtype)
    b = torch.randn(size, size, device=dev).to(dtype)
    for _ in range(2):
        torch.mm(a, b)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    count = 0
    started = time.perf_counter()
    while True:
        torch.mm(a, b)
        count += 1
        if count % 4 == 0:
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if time.perf_counter() - started >= seconds:
                break
    elapsed = time.perf_counter() - started
    return 2.0 * size**3 * count / elapsed


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
