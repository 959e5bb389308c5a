"""Koopman unrolls: parallel periodic reencoding vs step-by-step, diffrax vs exact path.

The issue's shape: 100 initial conditions x 1000 steps, latent 128, periodic reencoding
every k = 25 steps, batched with `jax.vmap`, jitted, timed side by side in one process
(medians after a compiling warm-up):

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
"""

import argparse
import pathlib
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import RESULTS, compiled_memory, median_time, positive_int, save  # noqa: E402

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
        "--repeats", type=positive_int, default=5, help="timing repeats (5; 2 with --quick)"
    )
    args = parser.parse_args()
    num, steps, latent, k = (10, 200, 128, 25) if args.quick else (100, 1000, 128, 25)
    repeats = 2 if args.quick else args.repeats
    key = jr.key(0)
    model = make_model(latent, key)
    x0s = ls.Duffing().sample_initial(jr.fold_in(key, 2), num)
    dt = 0.01
    ts = dt * jnp.arange(steps + 1, dtype=jnp.float32)

    def discrete(method):
        @eqx.filter_jit
        def fn(model, x0s):
            return jax.vmap(
                lambda x: ls.unroll(model, x, steps=steps, reencode_every=k, method=method)
            )(x0s)

        return fn

    def continuous(exact):
        @eqx.filter_jit
        def fn(model, x0s):
            # ts is closed over (concrete), so the exact path computes one exponential
            # per distinct offset (k + 1), not one per output time.
            return jax.vmap(
                lambda x: ls.unroll_continuous(
                    model, x, ts, reencode_dt=k * dt, num_segments=steps // k, exact=exact
                )
            )(x0s)

        return fn

    fns = {
        "parallel": (discrete("parallel"), (model, x0s)),
        "sequential": (discrete("sequential"), (model, x0s)),
        "continuous": (continuous(False), (model, x0s)),
        "exact": (continuous(True), (model, x0s)),
    }
    results, outputs = {}, {}
    for name, (fn, fargs) in fns.items():
        outputs[name] = fn(*fargs)
        seconds = median_time(lambda fn=fn, fargs=fargs: fn(*fargs), repeats=repeats)
        params, static = eqx.partition(fargs[0], eqx.is_array)
        memory = compiled_memory(
            lambda p, *a, fn=fn, static=static: fn(eqx.combine(p, static), *a), params, *fargs[1:]
        )
        results[name] = {"seconds": seconds, **memory}
        print(f"{name:>10}: {seconds * 1e3:9.1f} ms", flush=True)
    seq_err = float(jnp.max(jnp.abs(outputs["parallel"] - outputs["sequential"])))
    cont_err = float(jnp.max(jnp.abs(outputs["continuous"] - outputs["exact"])))
    grid_err = float(jnp.max(jnp.abs(outputs["exact"][:, 1:] - outputs["parallel"])))
    ratios = {
        "sequential_over_parallel": results["sequential"]["seconds"]
        / results["parallel"]["seconds"],
        "continuous_over_exact": results["continuous"]["seconds"] / results["exact"]["seconds"],
        "continuous_over_parallel": results["continuous"]["seconds"]
        / results["parallel"]["seconds"],
    }
    print(f"parallel is {ratios['sequential_over_parallel']:.1f}x faster than step by step")
    print(
        f"diffrax vs exact: {ratios['continuous_over_exact']:.2f}x the time, max error "
        f"{cont_err:.2e}; parallel vs sequential max difference {seq_err:.2e}"
    )
    payload = {
        "shape": {"initial_conditions": num, "steps": steps, "latent": latent, "k": k},
        "quick": args.quick,
        "results": results,
        "ratios": ratios,
        "max_abs_error": {
            "parallel_vs_sequential": seq_err,
            "continuous_vs_exact": cont_err,
            "exact_continuous_vs_bilinear_discrete": grid_err,
        },
    }
    path = save("koopman_quick" if args.quick else "koopman", payload, args=args, parser=parser)
    plot(results, ratios, path.with_suffix(".png"))
    print(f"saved {path}")


def plot(results, ratios, path: pathlib.Path) -> None:
    from matplotlib.figure import Figure

    names = list(results)
    ms = [results[n]["seconds"] * 1e3 for n in names]
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    bars = ax.bar(names, ms, color=["C0", "C1", "C2", "C3"])
    ax.bar_label(bars, fmt="%.0f ms")
    ax.set_yscale("log")
    ax.set_ylabel("median time per call (ms)")
    ax.set_title(
        f"100 ICs x 1000 steps, latent 128, k = 25 ({jax.default_backend()})\n"
        f"parallel {ratios['sequential_over_parallel']:.1f}x faster than step by step",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    RESULTS.mkdir(parents=True, exist_ok=True)
    main()
