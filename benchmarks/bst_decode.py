"""Per-token cost of Block-State Transformer decoding: the incremental decoder that
`lineax_seq.generate` runs, against recomputing the logits from the whole prefix.

A 4-layer language model of each of the experiment's variants (SLIDE, BRECT:FIXED:SKIP,
BST:SH:S4, BST:MH:S4, BST:MF:UNSTRUCT), its layers at the shape of Fig. 2.5 (`bst.py`:
embedding 512, 16 heads, W = 128, S4D state 16, 128 BRECT states; a byte vocabulary;
the BST layers are `(0, 2, 3)`, BRECT's recurrent layer is 1). At each prefix length P:

- **decode**: a jitted `lax.scan` of the public `lm.step` over 32 tokens after the
  cache that `lm.prefill` leaves after P tokens, per token (`generate`'s loop after the
  prompt, but with `step`'s per-token checks, which that loop leaves out, and without
  sampling);
- **recompute**: the jitted forward pass `lm(tokens[:P])`, what each new token costs
  without a cache;
- **cache**: the bytes the decoding cache holds, for `max_length` the power of two
  `>= P + 32` (as `generate` allocates it).

SLIDE, BRECT and the S4 variants keep a fixed-size state (attention frame of two
blocks, S4D modes, BRECT states), so their decode cost should not grow with P; the
UNSTRUCT filters have no recurrence and convolve the stored inputs, `O(max_length)` per
token. Timed side by side in one process, medians over interleaved rounds.

    python benchmarks/bst_decode.py                 # P = 1k, 4k, 16k
    python benchmarks/bst_decode.py --quick         # P = 1k, 4k, fewer rounds
    python benchmarks/bst_decode.py --plot-only benchmarks/results/bst_decode.json

Writes `benchmarks/results/bst_decode.json` (`bst_decode_<backend>.json` off CPU,
`_quick` with `--quick`, tagged for other options) and a PNG beside it.
"""

import argparse
import pathlib
import statistics
import sys

import jax
import jax.random as jr

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import (  # noqa: E402
    add_plot_only,
    interleaved_times,
    plot_from_json,
    positive_int,
    recorded_device,
    save,
)

import lineax_seq as ls  # noqa: E402

VARIANTS = ("SLIDE", "BRECT", "BST:SH:S4", "BST:MH:S4", "BST:MF:UNSTRUCT")
VOCAB, DIM, LAYERS, HEADS, WINDOW, STATE_SIZE = 256, 512, 4, 16, 128, 16
TRAIN_LENGTH = 1024  # the UNSTRUCT filters' position scale (`max_length`)
STEPS = 32  # decoded tokens per timed call


def build(variant: str, key: jax.Array) -> ls.BlockStateTransformerLM:
    """The 4-layer LM of `variant` (BRECT: 128 states, `num_states` defaults to W)."""
    return ls.BlockStateTransformerLM.from_variant(
        variant,
        VOCAB,
        DIM,
        LAYERS,
        num_heads=HEADS,
        window=WINDOW,
        state_size=STATE_SIZE,
        max_length=TRAIN_LENGTH if variant.endswith("UNSTRUCT") else None,
        key=key,
    )


def _capacity(prefix: int) -> int:
    """`generate`'s cache length: the power of two `>= prefix + STEPS`."""
    return 1 << (prefix + STEPS - 1).bit_length()


@jax.jit
def _decode(lm, cache, tokens):
    """Last logits after feeding `tokens` one by one from `cache`."""
    _, logits = jax.lax.scan(lambda c, t: lm.step(c, t), cache, tokens)
    return logits[-1]


@jax.jit
def _recompute(lm, tokens):
    """Next-token logits from the whole prefix, without a cache."""
    return lm(tokens)[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="P = 1k, 4k; fewer rounds")
    parser.add_argument(
        "--lengths",
        type=positive_int,
        nargs="+",
        help=f"override prefix lengths (multiples of the window, {WINDOW})",
    )
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument(
        "--repeats", type=positive_int, default=None, help="timing rounds (5; 3 with --quick)"
    )
    add_plot_only(parser)
    args = parser.parse_args(argv)
    if args.plot_only:
        print(f"wrote {plot_from_json(_plot, args.plot_only)}")
        return 0
    if bad := [n for n in args.lengths or () if n % WINDOW]:
        parser.error(f"--lengths {bad}: every length must be a multiple of the window, {WINDOW}")
    lengths = args.lengths or ([1024, 4096] if args.quick else [1024, 4096, 16384])
    repeats = args.repeats or (3 if args.quick else 5)

    keys = jr.split(jr.key(0), len(args.variants) + 1)
    models = {v: build(v, k) for v, k in zip(args.variants, keys[1:], strict=True)}
    params = {
        v: sum(x.size for x in jax.tree.leaves(lm) if isinstance(x, jax.Array))
        for v, lm in models.items()
    }
    for variant, n in params.items():
        print(f"{variant:16s} {n / 1e6:6.2f}M parameters", flush=True)
    tokens = jr.randint(keys[0], (max(lengths) + STEPS,), 0, VOCAB)

    decode: dict[str, dict[int, float]] = {v: {} for v in models}
    recompute: dict[str, dict[int, float]] = {v: {} for v in models}
    cache_bytes: dict[str, dict[int, int]] = {v: {} for v in models}
    rounds: dict[int, int] = {}
    for length in lengths:
        prefix, new = tokens[:length], tokens[length : length + STEPS]
        calls = {}
        for variant, lm in models.items():
            cache, _ = lm.prefill(prefix, _capacity(length))
            cache_bytes[variant][length] = sum(x.nbytes for x in jax.tree.leaves(cache))
            calls[(variant, "decode")] = lambda lm=lm, c=cache, t=new: _decode(lm, c, t)
            calls[(variant, "recompute")] = lambda lm=lm, t=prefix: _recompute(lm, t)
        rounds[length] = repeats if length <= 4096 else max(3, repeats // 2)
        wall, _, _ = interleaved_times(calls, rounds=rounds[length])
        for variant in models:
            decode[variant][length] = statistics.median(wall[(variant, "decode")]) / STEPS
            recompute[variant][length] = statistics.median(wall[(variant, "recompute")])
            print(
                f"P={length:6d} {variant:16s} decode {decode[variant][length] * 1e3:8.2f} ms/token"
                f"  recompute {recompute[variant][length] * 1e3:9.1f} ms"
                f"  ({recompute[variant][length] / decode[variant][length]:7.1f}x)"
                f"  cache {cache_bytes[variant][length] / 2**20:8.2f} MiB",
                flush=True,
            )

    first, last = lengths[0], lengths[-1]
    growth = {v: decode[v][last] / decode[v][first] for v in models}
    for variant, g in growth.items():
        print(f"{variant:16s} decode cost at P={last} / P={first}: {g:.2f}x")
    per_length = lambda d: {v: {str(k): x for k, x in by.items()} for v, by in d.items()}
    payload = {
        "setting": {
            "vocab_size": VOCAB,
            "dim": DIM,
            "num_layers": LAYERS,
            "heads": HEADS,
            "window": WINDOW,
            "ssm_state_size": STATE_SIZE,
            "unstruct_max_length": TRAIN_LENGTH,
            "decoded_tokens_per_call": STEPS,
            "batch": 1,
            "dtype": "float32",
            "timing": "median over interleaved rounds; decode: seconds per token of a "
            "jitted scan of lm.step after lm.prefill; recompute: one jitted forward pass "
            "over the prefix",
        },
        "rounds": {str(k): n for k, n in rounds.items()},
        "lengths": lengths,
        "parameters": params,
        "decode_seconds_per_token": per_length(decode),
        "recompute_seconds": per_length(recompute),
        "recompute_over_decode": {
            v: {str(k): recompute[v][k] / decode[v][k] for k in lengths} for v in models
        },
        "decode_growth": {f"P={last} / P={first}": growth},
        "cache_bytes": per_length(cache_bytes),
    }
    stem = "bst_decode_quick" if args.quick else "bst_decode"
    path = save(stem, payload, args=args, parser=parser)
    print(f"wrote {path} and {plot_from_json(_plot, path).name}")
    return 0


def _points(by_length: dict[str, float], scale: float) -> tuple[list[int], list[float]]:
    """`(lengths, values * scale)` of a JSON entry keyed by length, in length order."""
    lengths = sorted(by_length, key=int)
    return [int(k) for k in lengths], [by_length[k] * scale for k in lengths]


def _plot(record: dict, path: pathlib.Path) -> None:
    """Per-token time and cache size against the prefix length, from a results JSON."""
    from matplotlib.figure import Figure

    decode, recompute = record["decode_seconds_per_token"], record["recompute_seconds"]
    cache = record["cache_bytes"]
    _, device = recorded_device(record)
    fig = Figure(figsize=(11, 4.2))
    ax_t, ax_m = fig.subplots(1, 2)
    for i, variant in enumerate(decode):
        color = f"C{i}"
        xs, ys = _points(decode[variant], 1e3)
        ax_t.plot(xs, ys, marker="o", color=color, label=f"{variant} decode")
        ax_t.plot(*_points(recompute[variant], 1e3), marker="x", linestyle="--", color=color)
        ax_m.plot(*_points(cache[variant], 2**-20), marker="o", color=color, label=variant)
    ax_t.plot([], [], "k--x", label="recompute the prefix (each variant's colour)")
    ax_t.set_ylabel("ms per new token")
    ax_t.set_title(f"Next-token cost, {LAYERS}-layer LM, E={DIM}, W={WINDOW} ({device})")
    ax_m.set_ylabel("decoding cache (MiB)")
    ax_m.set_title("Cache size")
    for ax in (ax_t, ax_m):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prefix length P (tokens)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
