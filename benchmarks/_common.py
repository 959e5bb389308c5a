"""Shared timing, memory and result helpers for the benchmark scripts.

Every benchmark times its competitors side by side in one process, reports medians
and ratios, and writes `benchmarks/results/<name>.json` plus a plot.
"""

import json
import pathlib
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax

RESULTS = pathlib.Path(__file__).parent / "results"


def median_time(fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time in seconds of `fn()` (its outputs are blocked on), after warmup."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def compiled_memory(fn: Callable, *args: Any) -> dict[str, int]:
    """Bytes XLA plans for `jax.jit(fn)(*args)`: arguments, outputs and temporaries.

    `peak_bytes` is arguments + outputs + temporaries, the footprint of one call. It is
    read from the compiled executable, so it works on every backend (CPU included).
    """
    analysis = jax.jit(fn).lower(*args).compile().memory_analysis()
    if analysis is None:
        return {}
    out = {
        "argument_bytes": int(analysis.argument_size_in_bytes),
        "output_bytes": int(analysis.output_size_in_bytes),
        "temp_bytes": int(analysis.temp_size_in_bytes),
    }
    out["peak_bytes"] = sum(out.values())
    return out


def environment() -> dict[str, Any]:
    """Where the numbers were taken."""
    device = jax.devices()[0]
    return {
        "backend": jax.default_backend(),
        "device": device.device_kind,
        "device_count": jax.device_count(),
        "jax": jax.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor_count": __import__("os").cpu_count(),
    }


def save(name: str, payload: dict[str, Any]) -> pathlib.Path:
    """Write `benchmarks/results/<name>.json` (suffixed with the backend off CPU)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    backend = jax.default_backend()
    stem = name if backend == "cpu" else f"{name}_{backend}"
    path = RESULTS / f"{stem}.json"
    path.write_text(json.dumps({"environment": environment(), **payload}, indent=2) + "\n")
    return path
