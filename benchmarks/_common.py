"""Shared timing, memory and result helpers for the benchmark scripts.

Every benchmark times its competitors in one process, reports medians and ratios, and
writes `benchmarks/results/<name>.json` plus a plot.
"""

import argparse
import hashlib
import importlib.metadata
import json
import math
import os
import pathlib
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jaxlib

# The command-line number types of the package's experiments, for the scripts' options.
from lineax_seq.experiments._cli import positive_float, positive_int  # noqa: F401

RESULTS = pathlib.Path(__file__).parent / "results"


def calls_per_sample(
    fn: Callable[[], Any], *, min_seconds: float = 0.02, max_calls: int = 1000
) -> int:
    """How many back-to-back calls of `fn` one timing sample needs to last `min_seconds`.

    1 for calls that take that long already (every CPU figure here); more for the
    sub-millisecond calls of an accelerator, whose samples then time a stream of
    asynchronous dispatches rather than one call's launch latency and clock ramp.
    `fn` is called after a warm-up up to three times, and the fastest call counts (one
    probe each gave two identical programs 24 and 35 calls); a call 10x longer than
    `min_seconds` is probed once.
    """
    jax.block_until_ready(fn())
    once = math.inf
    for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        once = min(once, time.perf_counter() - start)
        if once >= 10 * min_seconds:
            break
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


def round_order(names: Sequence[str], r: int) -> list[str]:
    """The competitors' order in round `r`: rotated by one each round, so that no one
    always runs first, or always right after the heaviest (the same program timed in
    two places of a fixed order read up to 12% apart)."""
    names = list(names)
    shift = r % max(len(names), 1)
    return names[shift:] + names[:shift]


class Timings(NamedTuple):
    """Per-call seconds of each competitor, one entry per round it took part in."""

    wall: dict[str, list[float]]
    cpu: dict[str, list[float]]
    #: How many back-to-back calls each of a competitor's samples timed.
    calls_per_sample: dict[str, int]


def interleaved_times(
    calls: dict, *, rounds: int, slow_rounds: int = 0, slow: frozenset[str] = frozenset()
) -> Timings:
    """Wall and process-CPU seconds per call of each competitor, over interleaved rounds
    (in `round_order`), and the number of calls each sample timed.

    Each call is warmed up (compiled) first and given its `calls_per_sample`: a round
    times that many back-to-back calls and blocks on the last, so that a sub-millisecond
    accelerator call is timed as a stream of dispatches rather than one launch (timed one
    call at a time, two identical GPU programs read 33% apart). Competitors named in
    `slow` take part in the first `slow_rounds` rounds only. The CPU time of this
    process (all threads) is what the call would take on an otherwise idle machine if it
    ran on one core at a time, so it bounds the unloaded wall time from above for
    CPU-bound work: on a shared, loaded machine it is the fairer figure to compare with
    outside timings.
    """
    number = {name: calls_per_sample(call) for name, call in calls.items()}
    wall: dict[str, list[float]] = {name: [] for name in calls}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(rounds):
        for name in round_order(calls, r):
            call, n = calls[name], number[name]
            if name in slow and r >= slow_rounds:
                continue
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(n - 1):
                call()
            jax.block_until_ready(call())
            wall[name].append((time.perf_counter() - start) / n)
            cpu[name].append((time.process_time() - start_cpu) / n)
    return Timings(wall, cpu, number)


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


def _cpu_model() -> str:
    """The CPU's model name (Linux's `/proc/cpuinfo`), else `platform.processor()`."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _commit() -> str | None:
    """The checkout's commit (`+dirty` with uncommitted changes or untracked files
    outside `benchmarks/results/`), or `None` outside git."""
    git = lambda *a: subprocess.run(
        ["git", *a], cwd=RESULTS.parent, capture_output=True, text=True, timeout=10
    )
    try:
        head = git("rev-parse", "HEAD")
        if head.returncode:
            return None
        # New source files count; results, being written, do not.
        status = git("status", "--porcelain").stdout.splitlines()
        dirty = [s for s in status if not s[3:].startswith("benchmarks/results/")]
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


def _versions() -> dict[str, str | None]:
    """Versions of the packages the timed code runs on (`None`: not installed)."""
    out = {}
    for name in ("lineax_seq", "equinox", "optax", "diffrax", "numpy", "grain", "torch"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def environment() -> dict[str, Any]:
    """Where the numbers were taken: backend, device and CPU, versions, commit, and the
    settings that change compiled programs (`XLA_FLAGS`, `JAX_*` variables, matmul
    precision)."""
    device = jax.devices()[0]
    return {
        "backend": jax.default_backend(),
        "device": device.device_kind,
        "device_count": jax.device_count(),
        "cpu": _cpu_model(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor_count": os.cpu_count(),
        "commit": _commit(),
        "versions": _versions(),
        "matmul_precision": str(jax.config.jax_default_matmul_precision),
        "variables": {
            k: v for k, v in sorted(os.environ.items()) if k == "XLA_FLAGS" or k.startswith("JAX_")
        },
    }


def save(
    name: str,
    payload: dict[str, Any],
    *,
    args: argparse.Namespace | None = None,
    parser: argparse.ArgumentParser | None = None,
    named: Sequence[str] = ("quick",),
    complete: bool = True,
) -> pathlib.Path:
    """Write `benchmarks/results/<name>.json` (suffixed with the backend off CPU), with
    the environment and the command line.

    With `args` and their `parser`, a run that changes any option other than those
    `named` (which the script puts into `name` itself, e.g. `--quick`) gets a file of its
    own, `<name>_<tag>.json` with `tag` a hash of the changed options, so that a reduced
    rerun (fewer lengths, rounds...) never overwrites the committed results.

    A script saving after each length passes `complete=False` until the last: those
    results go to `<name>_partial...json` (never replacing a complete run's), which the
    complete save then deletes with its plot. The record's `"complete"` says which.
    """
    RESULTS.mkdir(parents=True, exist_ok=True)
    backend = jax.default_backend()
    stem = name if backend == "cpu" else f"{name}_{backend}"
    options = {} if args is None else vars(args)
    changed = {
        k: v for k, v in sorted(options.items()) if k not in named and v != parser.get_default(k)
    }
    if changed:
        text = json.dumps(changed, default=str, sort_keys=True)
        stem += "_" + hashlib.sha1(text.encode()).hexdigest()[:6]
    path = RESULTS / f"{stem}.json"
    partial = path.with_name(path.name.replace(name, f"{name}_partial", 1))
    command = shlex.join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]])
    record = {"environment": environment(), "command": command, "options": options}
    record["complete"] = complete
    text = json.dumps({**record, **payload}, indent=2, default=str) + "\n"
    if not complete:
        path, partial = partial, None
    path.write_text(text)
    if partial is not None:  # this run's partial results, superseded
        for superseded in (partial, partial.with_suffix(".png")):
            superseded.unlink(missing_ok=True)
    if changed:
        print(f"options {changed} differ from the defaults: results in {path.name}")
    return path


def add_plot_only(parser: argparse.ArgumentParser) -> None:
    """The `--plot-only JSON` option: redraw a results JSON's plot, time nothing."""
    parser.add_argument(
        "--plot-only",
        type=pathlib.Path,
        metavar="JSON",
        help="only (re)draw the PNG beside a results JSON, from the JSON",
    )


def plot_from_json(plot: Callable[[dict, pathlib.Path], None], path: pathlib.Path) -> pathlib.Path:
    """Draw `plot(record, png)` from the results JSON at `path` into the PNG beside it.

    The scripts draw every plot this way, from what the JSON holds (the machine it names,
    not the one drawing), so that a committed JSON redraws its PNG anywhere."""
    png = pathlib.Path(path).with_suffix(".png")
    try:
        record = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: --plot-only {path}: cannot read a results JSON ({e})") from e
    if not isinstance(record, dict):
        raise SystemExit(f"error: --plot-only {path}: not a results JSON (not a JSON object)")
    try:
        plot(record, png)
    except KeyError as e:
        raise SystemExit(
            f"error: --plot-only {path}: not a results JSON of this script (no {e} entry)"
        ) from e
    return png


def recorded_device(record: dict) -> tuple[str, str]:
    """`(backend, device kind)` a results JSON was taken on."""
    env = record.get("environment", {})
    return env.get("backend", "cpu"), env.get("device", "cpu")


def plot_lengths(
    series: dict[str, list[tuple[int, float]]],
    path: pathlib.Path,
    title: str,
    *,
    dashed: Sequence[str] = (),
) -> None:
    """Forward time (ms) against sequence length, log-log, one line per `series` entry
    (`(length, ms)` points; those in `dashed` drawn dashed, e.g. quoted figures)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 4.5))
    ax = fig.subplots()
    for name, points in series.items():
        style = dict(color="k", linestyle="--", marker="x") if name in dashed else dict(marker="o")
        ax.plot(*zip(*points, strict=True), label=name, **style)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length L")
    ax.set_ylabel("forward time per batch (ms)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
