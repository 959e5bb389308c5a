"""Koopman unrolls: parallel periodic reencoding vs step-by-step, diffrax vs exact path.

The issue's shape: 100 initial conditions x 1000 steps, latent 128, periodic reencoding
every k = 25 steps, batched with `jax.vmap`, `jax.jit` over the model's arrays (split
from the rest once), timed side by side in one process in interleaved rounds after a
compiling warm-up (each round times every competitor over `calls_per_sample`
back-to-back calls, 1 when a call lasts 20 ms); times are medians over rounds, ratios
medians of the per-round ratios:

- `parallel`: `lineax_seq.unroll(..., method="parallel")`: between reencodings the
    latent recurrence is one batched product with a table of powers of `Kbar`, and all
    1000 states are decoded at once (target: >= 5x faster than step by step).
- `sequential`: the same unroll as a step-by-step `lax.scan` (`method="sequential"`).
- `continuous`: `lineax_seq.unroll_continuous` (diffrax Tsit5 + PID controller,
    rtol 1e-6, atol 1e-8) over the same horizon (t in [0, 10], reencoding every 0.25).
- `exact`: `unroll_continuous(..., exact=True)`: the matrix-exponential path (oracle);
    the max error of `continuous` against it is reported.

    python benchmarks/koopman.py            # full
    python benchmarks/koopman.py --quick    # smoke run
    python benchmarks/koopman.py --plot-only benchmarks/results/koopman.json  # redraw
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
    compiled_memory,
    interleaved_times,
    paired_ratio,
    plot_from_json,
    positive_int,
    recorded_device,
    save,
)

import lineax_seq as ls  # noqa: E402


def make_model(latent: int, key):
    """A Duffing-sized Koopman model whose generator is a damped rotation (bounded flow)."""
    model = ls.KoopmanAutoencoder(2, latent, width=128, key=key)
    a = jr.normal(jr.fold_in(key, 1), (latent, latent)) / latent**0.5
    K = 0.5 * (a - a.T) * 3.0 - 0.05 * jnp.eye(latent)
    return eqx.tree_at(lambda m: m.dynamics.K, model, K)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 ICs x 200 steps")
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=None,
        help="timing rounds (5; 3 with --quick: an odd count, so each median is one round's)",
    )
    add_plot_only(parser)
    args = parser.parse_args()
    if args.plot_only:
        print(f"wrote {plot_from_json(plot, args.plot_only)}")
        return
    num, steps, latent, k = (10, 200, 128, 25) if args.quick else (100, 1000, 128, 25)
    repeats = args.repeats or (3 if args.quick else 5)
    key = jr.key(0)
    model = make_model(latent, key)
    params, static = eqx.partition(model, eqx.is_array)
    x0s = ls.Duffing().sample_initial(jr.fold_in(key, 2), num)
    dt = 0.01
    ts = dt * jnp.arange(steps + 1, dtype=jnp.float32)

    # `(params, x0s) -> states`, with the model's non-array parts closed over.
    def discrete(method):
        def fn(params, x0s):
            model = eqx.combine(params, static)
            return jax.vmap(
                lambda x: ls.unroll(model, x, steps=steps, reencode_every=k, method=method)
            )(x0s)

        return fn

    def continuous(exact):
        def fn(params, x0s):
            model = eqx.combine(params, static)
            # ts is closed over (concrete), so the exact path computes one exponential
            # per distinct offset (k + 1), not one per output time.
            return jax.vmap(
                lambda x: ls.unroll_continuous(
                    model, x, ts, reencode_dt=k * dt, num_segments=steps // k, exact=exact
                )
            )(x0s)

        return fn

    fns = {
        "parallel": discrete("parallel"),
        "sequential": discrete("sequential"),
        "continuous": continuous(False),
        "exact": continuous(True),
    }
    jitted = {name: jax.jit(fn) for name, fn in fns.items()}
    outputs = {name: fn(params, x0s) for name, fn in jitted.items()}
    calls = {name: lambda fn=fn: fn(params, x0s) for name, fn in jitted.items()}
    times, cpu_times, number = interleaved_times(calls, rounds=repeats)
    results = {}
    for name, fn in fns.items():
        seconds = statistics.median(times[name])
        results[name] = {
            "seconds": seconds,
            "cpu_seconds": statistics.median(cpu_times[name]),
            "calls_per_sample": number[name],
            "rounds": len(times[name]),
            **compiled_memory(fn, params, x0s),
        }
        print(f"{name:>10}: {seconds * 1e3:9.2f} ms ({number[name]} calls per sample)", flush=True)
    seq_err = float(jnp.max(jnp.abs(outputs["parallel"] - outputs["sequential"])))
    cont_err = float(jnp.max(jnp.abs(outputs["continuous"] - outputs["exact"])))
    grid_err = float(jnp.max(jnp.abs(outputs["exact"][:, 1:] - outputs["parallel"])))
    ratios = {
        f"{slower}_over_{faster}": paired_ratio(times, slower, faster)
        for slower, faster in (
            ("sequential", "parallel"),
            ("continuous", "exact"),
            ("continuous", "parallel"),
        )
    }
    print(f"parallel is {ratios['sequential_over_parallel']:.1f}x faster than step by step")
    print(
        f"diffrax vs exact: {ratios['continuous_over_exact']:.2f}x the time, max error "
        f"{cont_err:.2e}; parallel vs sequential max difference {seq_err:.2e}"
    )
    payload = {
        "shape": {"initial_conditions": num, "steps": steps, "latent": latent, "k": k},
        "quick": args.quick,
        "rounds": repeats,
        "timing": "median over interleaved rounds; a round times each competitor over "
        "`calls_per_sample` back-to-back calls; ratios are medians of per-round ratios",
        "results": results,
        "ratios": ratios,
        "max_abs_error": {
            "parallel_vs_sequential": seq_err,
            "continuous_vs_exact": cont_err,
            "exact_continuous_vs_bilinear_discrete": grid_err,
        },
    }
    path = save("koopman_quick" if args.quick else "koopman", payload, args=args, parser=parser)
    print(f"saved {path} and {plot_from_json(plot, path).name}")


def plot(record: dict, path: pathlib.Path) -> None:
    """Median time per call of each unroll, from a results JSON."""
    from matplotlib.figure import Figure

    results, ratios, shape = record["results"], record["ratios"], record["shape"]
    _, device = recorded_device(record)
    names = list(results)
    ms = [results[n]["seconds"] * 1e3 for n in names]
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    bars = ax.bar(names, ms, color=["C0", "C1", "C2", "C3"])
    ax.bar_label(bars, fmt="%.3g ms")
    ax.set_yscale("log")
    ax.set_ylabel("median time per call (ms)")
    ax.set_title(
        f"{shape['initial_conditions']} ICs x {shape['steps']} steps, latent "
        f"{shape['latent']}, k = {shape['k']} ({device})\n"
        f"parallel {ratios['sequential_over_parallel']:.1f}x faster than step by step",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    RESULTS.mkdir(parents=True, exist_ok=True)
    main()
