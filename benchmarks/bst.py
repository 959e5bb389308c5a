"""Forward-pass speed and memory of one Block-State Transformer layer (the paper's Fig. 2.5).

One layer each of BST:SH, BST:MH, BST:MF (S4 kernels, state size 16), SLIDE (the
sliding-window block transformer) and BRECT:FIXED:SKIP (the block-recurrent layer,
`lax.scan` over blocks), at the paper's shape: embedding 512, 16 heads, window
W = 128, batch 1, sequence lengths 1k, 4k, 16k and 64k. All five are timed side by
side in one process (jitted forward, median over interleaved rounds; a call under
20 ms, as on a GPU, is timed over enough back-to-back calls to last 20 ms) and compared
by ratio; peak memory is what XLA plans for one call.

    python benchmarks/bst.py                    # L = 1k, 4k, 16k, 64k, float32
    python benchmarks/bst.py --quick            # L = 1k, 4k, fewer repeats
    python benchmarks/bst.py --dtype bfloat16   # weights and activations in bfloat16
    python benchmarks/bst.py --dtype bfloat16 --attention cudnn   # NVIDIA GPUs
    python benchmarks/bst.py --plot-only benchmarks/results/bst.json  # redraw its PNG

Writes `benchmarks/results/bst.json` (`bst_<backend>.json` off CPU, `bst_quick.json` with
`--quick`, `bst_bf16*.json` in bfloat16, `*_cudnn*` with `--attention cudnn`, a tag of
the options, as `_common.save` gives, for any other option, `--no-flops` included) and a
PNG beside it. In bfloat16 (the meliad reference's dtype) the layers keep their float32
islands: attention logits and softmax, the S4D kernel and the FFT convolution.
`--attention cudnn` builds every layer with `attention_implementation="cudnn"` (cuDNN's
fused flash attention; NVIDIA GPUs, bfloat16).
Runs unchanged on GPU, where the blocks of BST run in parallel while BRECT's scan over
blocks cannot fill the device (on an H200 in bfloat16, BRECT is 3.6x slower than
BST:SH at 16k with XLA's attention and 7.0-8.2x at 16k-64k with cuDNN's, against the
paper's 6-11x); on a 2-core CPU the parallelism has little room to pay off.
"""

import argparse
import pathlib
import statistics
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import (  # noqa: E402
    RESULTS,
    add_plot_only,
    calls_per_sample,
    compiled_memory,
    interleaved_times,
    median_time,
    plot_from_json,
    positive_int,
    recorded_device,
    save,
)

import lineax_seq as ls  # noqa: E402

DIM = 512
HEADS = 16
WINDOW = 128
STATE_SIZE = 16
BRECT_STATES = 128
VARIANTS = ("BST:SH", "BST:MH", "BST:MF", "SLIDE", "BRECT")
# google-research/meliad on this machine's CPU (fixed gate, skip FFN, 128 states,
# W 128, E 512, batch 1): forward seconds by sequence length.
MELIAD_CPU = {
    "SLIDE": {1024: 0.022, 16384: 0.424},
    "BRECT": {1024: 0.043, 16384: 0.884},
}
# What the reference computes, read from google-research/meliad (configs
# transformer/configs/base_htrans.gin, recurrent/bias_skip.gin, recurrent/states_128.gin;
# code transformer/memory/transformer_layer.py, transformer_base.py, nn_components.py),
# next to ours. Written into the JSON so the comparison's shape is on record.
MELIAD_LAYER = {
    "source": "google-research/meliad, base_htrans.gin + recurrent/bias_skip.gin + "
    "recurrent/states_128.gin; transformer/memory/transformer_layer.py, transformer_base.py",
    "heads_x_head_size": "8 x 128 in base_htrans.gin (attention width 1024 = 2 E); ours "
    "16 x 32 (width 512 = E, the paper's Fig. 2.5 setting). At 16 x 32 the reference's "
    "layer has our FLOPs (about 7.0 GFLOP for SLIDE at 1k); at 8 x 128 about 9.7 GFLOP.",
    "projections": "Q, K, V (+ Q2 for cross-attention in the recurrent layer), no biases; "
    "keys and queries L2-normalised per head with a learned per-head scale; ours: Q, K, V "
    "(+ cross Q), no biases, 1/sqrt(d) scaling",
    "post_attention": "one dense [self ; cross] heads -> E, no bias (ours: SLIDE's "
    "without bias, BST's and BRECT's [self ; cross] projection with bias)",
    "ffn": "2 layers, hidden 2048 = 4 E, ReLU, no biases (ours: 4 E, ReLU, with biases)",
    "layer_norm": "scale only (no mean, no bias); ours: standard LayerNorm",
    "position": "T5 relative bias, 32 buckets, max distance 128 (same as ours)",
    "windows": "queries of a window (W) attend to the previous and own window (2 W keys, "
    "causal sliding mask); the windows are a Python-unrolled loop "
    "(max_unrolled_windows = -1); token-side projections and FFN run over the whole "
    "sequence outside the loop (ours: all blocks batched, no loop)",
    "recurrent": "128 states; gate_type 'bias' (one fixed learned gate) and skip_ffn (no FFN "
    "on the state path); per window the states' own K, V, Q, Q2, self-attention over the "
    "states, cross-attention to the window's 2 W keys, one dense + gate. Ours: same, "
    "except the states read the block's own W keys.",
    "dtype": "DTYPE = 'bfloat16' in base_htrans.gin ('For training on TPU'); ours float32",
    "note": "The meliad seconds are the issue's figures, not measured by this script (flax "
    "and gin are not installed here). 22 ms for SLIDE at 1k is 318 GFLOP/s at our 7.0 "
    "GFLOP: compare it with `gemm_gflops`, this run's float32 matmul probe, before "
    "comparing milliseconds (the development host measured 283 and, later, 512).",
}
# ratio name -> (numerator, denominator)
RATIOS = {
    "BST:SH/SLIDE": ("BST:SH", "SLIDE"),
    "BST:MH/SLIDE": ("BST:MH", "SLIDE"),
    "BST:MF/SLIDE": ("BST:MF", "SLIDE"),
    "BRECT/SLIDE": ("BRECT", "SLIDE"),
    "BRECT/BST:SH": ("BRECT", "BST:SH"),
    "BRECT/BST:MH": ("BRECT", "BST:MH"),
    "BRECT/BST:MF": ("BRECT", "BST:MF"),
}


def build_layer(variant: str, *, key: jax.Array, attention: str | None = None) -> eqx.Module:
    """One layer of `variant` at the Fig. 2.5 shape, its attention kernel `attention`."""
    kw = dict(attention_implementation=attention, key=key)
    if variant.startswith("BST:"):
        context = variant.split(":")[1].lower()
        return ls.BlockStateTransformerLayer(
            DIM, HEADS, WINDOW, context=context, ssm="s4", state_size=STATE_SIZE, **kw
        )
    if variant == "SLIDE":
        return ls.SlidingWindowLayer(DIM, HEADS, WINDOW, **kw)
    if variant == "BRECT":
        return ls.BlockRecurrentTransformerLayer(DIM, HEADS, WINDOW, num_states=BRECT_STATES, **kw)
    raise ValueError(f"unknown variant {variant!r}")


def cast(layer: eqx.Module, dtype) -> eqx.Module:
    """`layer` with every floating-point array in `dtype`."""
    floating = lambda a: eqx.is_array(a) and jnp.issubdtype(a.dtype, jnp.floating)
    return jax.tree.map(lambda a: a.astype(dtype) if floating(a) else a, layer)


def forward_fn(layer: eqx.Module):
    """`(params, x) -> y`: the layer's forward pass as a pure function of its arrays."""
    params, static = eqx.partition(layer, eqx.is_array)

    def fn(params, x):
        return eqx.combine(params, static)(x)

    return params, fn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="L = 1k, 4k; fewer repeats")
    parser.add_argument(
        "--lengths",
        type=positive_int,
        nargs="+",
        help=f"override sequence lengths (multiples of the window, {WINDOW})",
    )
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument(
        "--repeats", type=positive_int, default=None, help="timing repeats (5; 3 with --quick)"
    )
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default="float32", help="(float32)"
    )
    parser.add_argument(
        "--attention",
        choices=("xla", "cudnn"),
        default="xla",
        help="attention kernel (xla); cudnn needs an NVIDIA GPU and --dtype bfloat16",
    )
    parser.add_argument(
        "--no-flops", action="store_true", help="skip XLA's FLOP counts (CPU compiles)"
    )
    add_plot_only(parser)
    args = parser.parse_args(argv)
    if args.plot_only:
        print(f"wrote {plot_from_json(_plot, args.plot_only)}")
        return 0
    if args.attention == "cudnn" and args.dtype != "bfloat16":
        parser.error("--attention cudnn needs --dtype bfloat16 (cuDNN's flash attention)")
    if args.attention == "cudnn" and jax.default_backend() != "gpu":
        parser.error(f"--attention cudnn needs an NVIDIA GPU; JAX runs on {jax.default_backend()}")
    if bad := [n for n in args.lengths or () if n % WINDOW]:
        parser.error(f"--lengths {bad}: every length must be a multiple of the window, {WINDOW}")
    dtype = jnp.dtype(args.dtype)
    lengths = args.lengths or ([1024, 4096] if args.quick else [1024, 4096, 16384, 65536])
    repeats = args.repeats or (3 if args.quick else 5)

    keys = jr.split(jr.key(0), len(args.variants) + 1)
    layers = {
        v: cast(build_layer(v, key=k, attention=args.attention), dtype)
        for v, k in zip(args.variants, keys[1:], strict=True)
    }
    params = {}
    for variant, layer in layers.items():
        params[variant] = sum(x.size for x in jax.tree.leaves(eqx.filter(layer, eqx.is_array)))
        print(f"{variant:8s} {params[variant] / 1e6:6.2f}M parameters", flush=True)

    gemm = _gemm_gflops(dtype)
    print(f"machine: {gemm:.0f} GFLOP/s on a (1024 x 512) @ (512 x 2048) {dtype} matmul")
    times: dict[str, dict[int, float]] = {v: {} for v in args.variants}
    best: dict[str, dict[int, float]] = {v: {} for v in args.variants}
    memory: dict[str, dict[int, int]] = {v: {} for v in args.variants}
    flops: dict[str, dict[int, float]] = {v: {} for v in args.variants}
    number: dict[str, dict[int, int]] = {v: {} for v in args.variants}
    rounds: dict[int, int] = {}
    done: list[int] = []
    brect_body = 0.0
    if "BRECT" in layers and not args.no_flops:
        # XLA counts a while loop's body once. BRECT's state update is a `lax.scan` over
        # the L / W blocks; its body's cost B is read off inputs of two and three blocks
        # (cost(nW) = nT + B, T the token side per block; a one-block scan is simplified
        # away) and added for the other L / W - 1 blocks.
        p, fn = forward_fn(layers["BRECT"])
        two, three = (
            _xla_flops(fn, p, jr.normal(keys[0], (n * WINDOW, DIM), dtype)) for n in (2, 3)
        )
        brect_body = 3 * two - 2 * three
    for length in lengths:
        x = jr.normal(keys[0], (length, DIM), dtype)
        calls = {}
        for variant, layer in layers.items():
            p, fn = forward_fn(layer)
            jitted = jax.jit(fn)
            calls[variant] = lambda jitted=jitted, p=p, x=x: jitted(p, x)
            memory[variant][length] = compiled_memory(fn, p, x).get("peak_bytes", -1)
            if args.no_flops:
                continue
            flops[variant][length] = _xla_flops(fn, p, x)
            if variant == "BRECT":
                flops[variant][length] += (length // WINDOW - 1) * brect_body
        # Round robin: every round times each variant once, so that load from other
        # processes on a shared machine hits all competitors alike.
        rounds[length] = repeats if length <= 16384 else max(3, repeats // 2)
        samples, _, per_sample = interleaved_times(calls, rounds=rounds[length])
        for variant, n in per_sample.items():
            number[variant][length] = n
        for variant in layers:
            times[variant][length] = statistics.median(samples[variant])
            best[variant][length] = min(samples[variant])
            gflop = flops[variant].get(length, float("nan")) / 1e9
            print(
                f"L={length:6d} {variant:8s} median {times[variant][length] * 1e3:9.2f} ms  "
                f"min {best[variant][length] * 1e3:9.2f} ms  "
                f"{gflop:7.2f} GFLOP  "
                f"peak {memory[variant][length] / 2**20:8.1f} MiB",
                flush=True,
            )
        done.append(length)
        _report(
            times,
            best,
            memory,
            flops,
            number,
            params,
            repeats,
            gemm,
            done,
            rounds=rounds,
            dtype=dtype,
            args=args,
            parser=parser,
            complete=len(done) == len(lengths),
        )

    return 0


def _report(
    times,
    best,
    memory,
    flops,
    number,
    params,
    repeats,
    gemm,
    done,
    *,
    rounds,
    dtype,
    args,
    parser,
    complete: bool,
) -> pathlib.Path:
    """Ratios, targets, JSON and plot for the lengths measured so far (saved after each
    length, so an interrupted long run keeps what it measured: under `<name>_partial`
    until the last length, so that it never replaces a complete run's files)."""
    quick, attention = args.quick, args.attention
    ratios = _ratios(times, done)
    flop_ratios = _ratios(flops, done)
    for name, by_length in ratios.items():
        cells = []
        for length, r in by_length.items():
            cell = f"{_length_label(length):>4s} {r:5.2f}x"
            if length in flop_ratios.get(name, {}):
                cell += f" (FLOPs {flop_ratios[name][length]:4.2f}x)"
            cells.append(cell)
        row = "  ".join(cells)
        print(f"{name:14s} {row}")

    targets = _targets(times, ratios, done)
    for name, result in targets.items():
        print(f"target {name}: {result}")

    payload = {
        "setting": {
            "dim": DIM,
            "heads": HEADS,
            "window": WINDOW,
            "ssm_state_size": STATE_SIZE,
            "brect_states": BRECT_STATES,
            "batch": 1,
            "dtype": str(dtype),
            "attention": attention,
            "pass": "forward, jitted, one layer",
            "repeats": repeats,
            "timing": "median over rounds; each round times every variant once, over "
            "calls_per_sample back-to-back calls (1 when a call lasts 20 ms)",
        },
        "rounds": {str(k): n for k, n in rounds.items()},
        "calls_per_sample": {v: {str(k): n for k, n in d.items()} for v, d in number.items()},
        "lengths": done,
        "parameters": params,
        "seconds": {v: {str(k): t for k, t in d.items()} for v, d in times.items()},
        "min_seconds": {v: {str(k): t for k, t in d.items()} for v, d in best.items()},
        "xla_flops": {v: {str(k): f for k, f in d.items()} for v, d in flops.items()},
        "peak_bytes": {v: {str(k): m for k, m in d.items()} for v, d in memory.items()},
        "ratios": {n: {str(k): r for k, r in d.items()} for n, d in ratios.items()},
        "flop_ratios": {n: {str(k): r for k, r in d.items()} for n, d in flop_ratios.items()},
        "meliad_cpu_seconds": {v: {str(k): t for k, t in d.items()} for v, d in MELIAD_CPU.items()},
        "meliad_layer": MELIAD_LAYER,
        "targets": targets,
        "gemm_gflops": gemm,
        "gflops_per_s": {
            v: {str(k): flops[v][k] / times[v][k] / 1e9 for k in d if k in flops[v]}
            for v, d in times.items()
        },
    }
    stem = "bst" if dtype == jnp.float32 else "bst_bf16"
    stem += "_cudnn" if attention == "cudnn" else ""
    # --no-flops changes the results (no FLOP counts): a tagged file, never bst.json.
    saving = dict(args=args, parser=parser, named=("quick", "dtype", "attention"))
    stem += "_quick" if quick else ""  # quick runs keep the full run's files
    path = save(stem, payload, **saving, complete=complete)
    print(f"wrote {path} and {plot_from_json(_plot, path).name}")
    return path


def _xla_flops(fn, *args) -> float:
    """FLOPs of `jax.jit(fn)(*args)` from XLA's CPU cost analysis (loops counted once).

    Always the CPU compiler's count (compiled, never run), so that the figures agree
    across backends: GPU cost analysis counts fusions and FFTs differently.
    """
    cpu = jax.devices("cpu")[0]
    args = jax.device_put(args, cpu)
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return float((cost or {}).get("flops", float("nan")))


def _gemm_gflops(dtype=jnp.float32) -> float:
    """Throughput of one mid-sized matmul, to calibrate the machine (and its load)."""
    a = jnp.ones((1024, DIM), dtype)
    b = jnp.ones((DIM, 4 * DIM), dtype)
    matmul = jax.jit(jnp.matmul)
    call = lambda: matmul(a, b)
    seconds = median_time(call, repeats=21, warmup=0, number=calls_per_sample(call))
    return 2 * a.shape[0] * DIM * 4 * DIM / seconds / 1e9


def _length_label(length: int) -> str:
    """`1k`, `16k` for multiples of 1,024; the number itself otherwise (`256`)."""
    return f"{length // 1024}k" if length % 1024 == 0 else str(length)


def _ratios(values, lengths) -> dict[str, dict[int, float]]:
    """`RATIOS` of `values[variant][length]`, for the variants and lengths present."""
    return {
        name: {k: values[a][k] / values[b][k] for k in lengths if k in values[a] and k in values[b]}
        for name, (a, b) in RATIOS.items()
        if a in values and b in values
    }


def _targets(times, ratios, lengths) -> dict[str, str]:
    """The issue's targets, as 'met'/'missed' with the measured figures."""
    out = {}
    backend = jax.default_backend()
    if "BST:SH/SLIDE" in ratios:
        worst = max(ratios["BST:SH/SLIDE"].values())
        out["BST:SH/SLIDE <= 1.3x (all L)"] = (
            f"{'met' if worst <= 1.3 else 'missed'} (max {worst:.2f}x)"
        )
    if "BRECT/BST:SH" in ratios:
        goal = 1.7 if backend == "cpu" else 6.0
        long = {k: r for k, r in ratios["BRECT/BST:SH"].items() if k >= 16384}
        if long:
            worst = min(long.values())
            out[f"BRECT/BST:SH >= {goal}x (L >= 16k, {backend})"] = (
                f"{'met' if worst >= goal else 'missed'} (min {worst:.2f}x)"
            )
    if backend == "cpu":
        for variant, ref in MELIAD_CPU.items():
            for length, seconds in ref.items():
                if length in times.get(variant, {}):
                    ours = times[variant][length]
                    verdict = "met" if ours <= seconds else "missed"
                    out[f"{variant} <= meliad at {_length_label(length)}"] = (
                        f"{verdict} ({ours * 1e3:.0f} ms vs {seconds * 1e3:.0f} ms)"
                    )
    return out


def _plot(record: dict, path: pathlib.Path) -> None:
    """Time and planned memory against length, from a results JSON."""
    from matplotlib.figure import Figure

    times, memory, lengths = record["seconds"], record["peak_bytes"], record["lengths"]
    setting = record["setting"]
    label = f"{setting.get('dtype', 'float32')}, {setting.get('attention', 'xla')} attention"
    backend, device = recorded_device(record)
    fig = Figure(figsize=(11, 4.2))
    ax_t, ax_m = fig.subplots(1, 2)
    for variant in times:
        xs = [k for k in lengths if str(k) in times[variant]]
        ax_t.plot(xs, [times[variant][str(k)] * 1e3 for k in xs], "o-", label=variant)
        ax_m.plot(xs, [memory[variant][str(k)] / 2**20 for k in xs], "o-", label=variant)
    for ref in record.get("meliad_cpu_seconds", {}).values():
        if backend == "cpu":
            ref = {int(k): t for k, t in ref.items()}
            ax_t.plot(list(ref), [t * 1e3 for t in ref.values()], "x:", color="grey")
    for ax, ylabel in ((ax_t, "forward time (ms)"), (ax_m, "peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend()
    ax_t.set_title(f"one layer, E={DIM}, H={HEADS}, W={WINDOW}, {label} ({device})")
    ax_m.set_title("XLA-planned peak memory of one call")
    if backend == "cpu":
        ax_t.annotate("x: meliad reference (SLIDE, BRECT)", (0.02, 0.95), xycoords="axes fraction")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    RESULTS.mkdir(parents=True, exist_ok=True)
    sys.exit(main())
