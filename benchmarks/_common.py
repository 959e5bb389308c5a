"""Shared timing, memory and result helpers for the benchmark scripts.

Every benchmark times its competitors side by side in one process, reports medians
and ratios, and writes `benchmarks/results/<name>.json` plus a plot.
"""

import json
import math
import pathlib
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax

RESULTS = pathlib.Path(__file__).parent / "results"


def calls_per_sample(
    fn: Callable[[], Any], *, min_seconds: float = 0.02, max_calls: int = 1000
) -> int:
    """How many back-to-back calls of `fn` one timing sample needs to last `min_seconds`.

    1 for calls that take that long already (every CPU figure here); more for the
    sub-millisecond calls of an accelerator, whose samples then time a stream of
    asynchronous dispatches rather than one call's launch latency and clock ramp.
    `fn` is called twice (a warm-up and a probe).
    """
    jax.block_until_ready(fn())
    start = time.perf_counter()
    jax.block_until_ready(fn())
    once = time.perf_counter() - start
    return int(min(max_calls, max(1, math.ceil(min_seconds / max(once, 1e-9)))))


def median_time(
    fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1, number: int = 1
) -> float:
    """Median wall time in seconds of `fn()` (its outputs are blocked on), after warmup.

    Each of the `repeats` samples runs `number` calls back to back, blocks on the last,
    and counts a `number`-th of its time.
    """
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number - 1):
            fn()
        jax.block_until_ready(fn())
        times.append((time.perf_counter() - start) / number)
    return statistics.median(times)


def interleaved_times(
    calls: dict, *, rounds: int, slow_rounds: int = 0, slow: frozenset[str] = frozenset()
) -> tuple[dict, dict]:
    """Wall and process-CPU seconds per call of each competitor, over interleaved rounds.

    Each call is warmed up (compiled) first; competitors named in `slow` take part in
    the first `slow_rounds` rounds only. The CPU time of this process (all threads) is
    what the call would take on an otherwise idle machine if it ran on one core at a
    time, so it bounds the unloaded wall time from above for CPU-bound work: on a
    shared, loaded machine it is the fairer figure to compare with outside timings.
    """
    for call in calls.values():
        jax.block_until_ready(call())
    wall: dict[str, list[float]] = {name: [] for name in calls}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(rounds):
        for name, call in calls.items():
            if name in slow and r >= slow_rounds:
                continue
            start, start_cpu = time.perf_counter(), time.process_time()
            jax.block_until_ready(call())
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return wall, cpu


def paired_ratio(times: dict, num: str, den: str) -> float:
    """Median over rounds of `times[num][r] / times[den][r]`."""
    return statistics.median(a / b for a, b in zip(times[num], times[den], strict=False))


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
