"""`python -m lineax_seq bst`: Block-State Transformer language modelling (Table 2.1, Fig. 2.3).

Trains SLIDE, BRECT:FIXED:SKIP, BST:SH:S4, BST:MH:S4 and BST:MF:UNSTRUCT language
models on a code corpus (default: the Python standard library's `.py` sources, byte
tokens) at one training length `L` with window `W`, matched in parameter count and
steps, then measures held-out perplexity at `L/2, L, 4L, 16L` on the *same* held-out
tokens, cut into sequences of each length: the paper's length-generalisation study.

    python -m lineax_seq bst                          # the committed run (2-core CPU, ~35 min)
    python -m lineax_seq bst --steps 50 --models SLIDE BST:SH:S4
    python -m lineax_seq bst --corpus path/to/texts   # any text corpus (file or directory)

Writes `bst_lm.json`, `bst_lm.png` and `bst_lm.md` (a README table) under `--out`
(default `benchmarks/results/`).
"""

import argparse
import dataclasses
import json
import math
import pathlib
import sys
import time
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
from jaxtyping import Array, Float, Int

LOG_EVERY = 5
MODELS = ("SLIDE", "BRECT", "BST:SH:S4", "BST:MH:S4", "BST:MF:UNSTRUCT")


@dataclasses.dataclass(frozen=True)
class Config:
    """Sizes and budget of one run (defaults: the committed CPU run)."""

    models: tuple[str, ...] = MODELS
    train_length: int = 1024
    window: int = 128
    dim: int = 128
    num_layers: int = 3
    num_heads: int = 4
    bst_layers: tuple[int, ...] = (1,)
    state_size: int = 16
    mf_filters: int = 32
    brect_states: int = 128
    steps: int = 400
    batch_size: int = 2
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    weight_decay: float = 0.01
    eval_multipliers: tuple[float, ...] = (0.5, 1.0, 4.0, 16.0)
    eval_tokens: int = 32768
    match_parameters: bool = True
    seed: int = 0

    def eval_lengths(self) -> list[int]:
        return [int(self.train_length * m) for m in self.eval_multipliers]


# --------------------------------------------------------------------------------------
# models


def build_lm(name: str, vocab_size: int, cfg: Config, *, mlp_dim: int, key: jax.Array):
    """The language model `name` (one of `MODELS`) at the sizes of `cfg`.

    All models share the embedding, the stack of sliding-window block transformer
    layers and the tied LM head; they differ only in the layers listed in
    `cfg.bst_layers`: plain (SLIDE), block-recurrent (BRECT, at the last of those
    indices) or Block-State (BST, context and SSM from the name).
    """
    import lineax_seq as ls

    if name not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {name!r}")
    common = dict(
        num_heads=cfg.num_heads,
        window=cfg.window,
        mlp_dim=mlp_dim,
        bst_layers=(),
        key=key,
    )
    if name == "BRECT":
        common.update(recurrent_layers=(max(cfg.bst_layers),), num_states=cfg.brect_states)
    elif name.startswith("BST:"):
        _, context, ssm = name.lower().split(":")
        common.update(
            bst_layers=cfg.bst_layers,
            context=context,
            ssm=ssm,
            state_size=cfg.state_size,
            num_filters=cfg.mf_filters,
            max_length=cfg.train_length,
        )
    return ls.BlockStateTransformerLM(vocab_size, cfg.dim, cfg.num_layers, **common)


def count_parameters(model) -> int:
    """Number of trainable scalars (array leaves) in `model`."""
    return sum(x.size for x in jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)))


def matched_mlp_dims(vocab_size: int, cfg: Config) -> dict[str, int]:
    """Per model, the MLP width that brings its parameter count closest to the largest one's.

    The BST and BRECT layers carry extra parameters (SSM, context lifts, cross
    attention, recurrent cell); the others get a wider MLP to compensate, so all models
    are compared at (nearly) the same size.
    """
    base = 4 * cfg.dim
    if not cfg.match_parameters:
        return dict.fromkeys(cfg.models, base)
    key = jr.key(0)

    def size(name, mlp_dim):
        shapes = eqx.filter_eval_shape(
            lambda k: build_lm(name, vocab_size, cfg, mlp_dim=mlp_dim, key=k), key
        )
        return sum(
            math.prod(x.shape)
            for x in jax.tree.leaves(shapes)
            if isinstance(x, jax.ShapeDtypeStruct) and jnp.issubdtype(x.dtype, jnp.inexact)
        )

    sizes = {name: size(name, base) for name in cfg.models}
    target = max(sizes.values())
    dims = {}
    for name in cfg.models:
        # parameter count is affine in mlp_dim: solve, then round to a multiple of 8
        slope = (size(name, base + 8) - sizes[name]) / 8
        dims[name] = base + 8 * round((target - sizes[name]) / slope / 8)
    return dims


# --------------------------------------------------------------------------------------
# data


def load_data(corpus: str | None, cfg: Config):
    """Training batches, held-out windows and the tokenizer (byte-level).

    - Training: shuffled `(batch_size, L)` causal-LM windows from the `"train"` split
      ([`lineax_seq.lm_dataset`][]), the same order for every model.
    - Held out: the first windows of `max(eval_lengths) + 1` tokens tiling the documents
      of the `"valid"` split, `cfg.eval_tokens` tokens in all (at least one window);
      every evaluation length cuts these same windows into shorter sequences.
    """
    import lineax_seq as ls

    tokenizer = ls.ByteTokenizer()
    train = ls.lm_dataset(
        ls.text_corpus(corpus, split="train"),
        tokenizer,
        length=cfg.train_length,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
    )
    longest = max(cfg.eval_lengths())
    windows = ls.lm_windows(ls.text_corpus(corpus, split="valid"), tokenizer, length=longest)
    count = min(len(windows), max(1, cfg.eval_tokens // longest))
    heldout = np.stack(
        [np.concatenate([windows[i]["inputs"], windows[i]["targets"][-1:]]) for i in range(count)]
    )
    return train, heldout, tokenizer


# --------------------------------------------------------------------------------------
# training and evaluation


def sequence_loss(
    model, inputs: Int[Array, " length"], targets: Int[Array, " length"]
) -> Float[Array, ""]:
    """Mean next-token cross-entropy (nats) of one sequence."""
    logits = model(inputs)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def batch_loss(model, batch: dict[str, Array]) -> Float[Array, ""]:
    """Mean of `sequence_loss` over a batch `{"inputs": (B, L), "targets": (B, L)}`."""
    losses = jax.vmap(sequence_loss, in_axes=(None, 0, 0))(model, batch["inputs"], batch["targets"])
    return losses.mean()


def _report(step: int, model, record: dict) -> None:
    if step % (10 * LOG_EVERY) == 0:
        print(f"    step {step:4d} loss {record['loss']:.3f}", flush=True)


def train(model, batches, cfg: Config, *, name: str = ""):
    """`cfg.steps` AdamW steps (warmup + cosine decay, clipping) with the library's loop.

    Returns the trained model, the training losses and their steps: one record per
    `LOG_EVERY` steps (the mean over those steps) plus, if `cfg.steps` is not a multiple
    of `LOG_EVERY`, one for the remaining steps (the loop's final flush).
    """
    import lineax_seq as ls

    optimizer = ls.make_optimizer(
        cfg.learning_rate,
        warmup_steps=cfg.warmup_steps,
        total_steps=max(cfg.steps, cfg.warmup_steps + 1),
        weight_decay=cfg.weight_decay,
        clip_norm=1.0,
    )
    print(f"  training {name}", flush=True)
    result = ls.train(
        model,
        optimizer,
        lambda model, batch, key: (batch_loss(model, batch), None),
        batches,
        steps=cfg.steps,
        key=jr.key(cfg.seed),
        log_every=LOG_EVERY,
        unit="tokens",
        progress=sys.stderr.isatty(),
        callback=_report if not sys.stderr.isatty() else None,
    )
    records = [r for r in result.history if r["split"] == "train"]
    return result.model, [r["loss"] for r in records], [r["step"] for r in records]


def evaluate(model, heldout: np.ndarray, length: int) -> float:
    """Mean next-token NLL (nats) of the held-out windows cut into sequences of `length`.

    `heldout` holds windows of `n + 1` tokens (`n` a multiple of `length`); every
    evaluation length scores exactly the same target tokens, so perplexities at
    different lengths differ only by how much context the model gets and uses.
    """
    n = heldout.shape[1] - 1
    if n % length:
        raise ValueError(f"evaluation length {length} must divide the held-out window {n}")
    loss = eqx.filter_jit(sequence_loss)
    total = 0.0
    for window in heldout:
        for start in range(0, n, length):
            inputs = jnp.asarray(window[start : start + length])
            targets = jnp.asarray(window[start + 1 : start + length + 1])
            total += float(loss(model, inputs, targets))
    return total / (heldout.shape[0] * (n // length))


# --------------------------------------------------------------------------------------
# the experiment


def run_experiment(cfg: Config, corpus: str | None, out: pathlib.Path) -> dict:
    """Train and evaluate every model of `cfg`; write JSON, plot and table under `out`."""
    train_data, heldout, tokenizer = load_data(corpus, cfg)
    vocab_size = tokenizer.vocab_size
    print(
        f"corpus: train batches of {cfg.batch_size} x {cfg.train_length} tokens; held out "
        f"{heldout.shape[0]} x {heldout.shape[1] - 1} tokens; vocab {vocab_size}",
        flush=True,
    )
    mlp_dims = matched_mlp_dims(vocab_size, cfg)
    lengths = cfg.eval_lengths()
    results: dict[str, Any] = {}
    for i, name in enumerate(cfg.models):
        key = jr.fold_in(jr.key(cfg.seed), i)
        model = build_lm(name, vocab_size, cfg, mlp_dim=mlp_dims[name], key=key)
        params = count_parameters(model)
        print(f"{name}: {params / 1e6:.3f}M parameters (MLP {mlp_dims[name]})", flush=True)
        start = time.perf_counter()
        try:
            model, losses, loss_steps = train(model, train_data, cfg, name=name)
        except FloatingPointError as e:  # record the divergence, keep the other models
            print(f"  {name} diverged: {e}", flush=True)
            results[name] = {"parameters": params, "mlp_dim": mlp_dims[name], "error": str(e)}
            continue
        train_seconds = time.perf_counter() - start
        ppl = {}
        for length in lengths:
            nll = evaluate(model, heldout, length)
            ppl[length] = math.exp(nll)
            print(f"  {name} eval L={length:6d}: perplexity {ppl[length]:.3f}", flush=True)
        results[name] = {
            "parameters": params,
            "mlp_dim": mlp_dims[name],
            "train_seconds": train_seconds,
            "eval_seconds": time.perf_counter() - start - train_seconds,
            "final_train_loss": float(np.mean(losses[-4:])),
            "train_loss": losses,
            "train_loss_steps": loss_steps,
            "perplexity": {str(k): v for k, v in ppl.items()},
        }
    payload = {
        "config": dataclasses.asdict(cfg),
        "corpus": corpus or "python stdlib (.py sources)",
        "vocab_size": vocab_size,
        "backend": jax.default_backend(),
        "eval_lengths": lengths,
        "results": results,
    }
    payload["summary"] = summarise(payload)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bst_lm.json").write_text(json.dumps(payload, indent=2) + "\n")
    (out / "bst_lm.md").write_text(table(payload) + "\n")
    plot(payload, out / "bst_lm.png")
    print(table(payload))
    for line in payload["summary"]["lines"]:
        print(line)
    print(f"wrote {out / 'bst_lm.json'}, bst_lm.png, bst_lm.md")
    return payload


def summarise(payload: dict) -> dict:
    """The issue's two goals, checked on the measured perplexities."""
    lengths = payload["eval_lengths"]
    results = {n: r for n, r in payload["results"].items() if "perplexity" in r}
    train_length = payload["config"]["train_length"]
    at_l = {n: r["perplexity"][str(train_length)] for n, r in results.items()}
    lines, out = [], {}
    if "SLIDE" in at_l:
        for name in (n for n in at_l if n.startswith("BST")):
            gain = 1 - at_l[name] / at_l["SLIDE"]
            out[f"{name} vs SLIDE at L"] = gain
            lines.append(
                f"{name} {'beats' if gain > 0 else 'does NOT beat'} SLIDE at L: "
                f"{at_l[name]:.3f} vs {at_l['SLIDE']:.3f} ({100 * gain:+.1f}%)"
            )
    longest = str(max(lengths))
    for name, r in results.items():
        drift = r["perplexity"][longest] / r["perplexity"][str(train_length)] - 1
        out[f"{name} ppl(16L)/ppl(L) - 1"] = drift
        if name == "BST:SH:S4":
            verdict = "within" if abs(drift) <= 0.05 else "NOT within"
            lines.append(
                f"BST:SH:S4 perplexity at {longest} is {verdict} 5% of its value at L "
                f"({100 * drift:+.1f}%)"
            )
    out["lines"] = lines
    return out


def table(payload: dict) -> str:
    """Markdown table: parameters, perplexity at every length, drift, final training loss
    (nats, mean of the last 4 logged records, on batches the model had not seen before
    its update), train time."""
    lengths = payload["eval_lengths"]
    train_length = payload["config"]["train_length"]
    head = ["model", "params"] + [
        f"ppl @ {n}" + (" (L)" if n == train_length else "") for n in lengths
    ]
    head += [f"{max(lengths)} / L", "train loss (last 20 steps)", "train s"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in payload["results"].items():
        if "perplexity" not in r:
            rows.append(f"| {name} | {r['parameters'] / 1e6:.2f}M | diverged |")
            continue
        ppl = r["perplexity"]
        cells = [name, f"{r['parameters'] / 1e6:.2f}M"] + [f"{ppl[str(n)]:.3f}" for n in lengths]
        cells += [f"{ppl[str(max(lengths))] / ppl[str(train_length)]:.3f}"]
        cells += [f"{r['final_train_loss']:.3f}" if "final_train_loss" in r else "-"]
        cells += [f"{r['train_seconds']:.0f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot(payload: dict, path: pathlib.Path) -> None:
    """Perplexity against evaluation length (Fig. 2.3) and the training curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = payload["eval_lengths"]
    train_length = payload["config"]["train_length"]
    fig, (ax_l, ax_t) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, r in payload["results"].items():
        if "perplexity" not in r:
            continue
        ax_l.plot(lengths, [r["perplexity"][str(n)] for n in lengths], "o-", label=name)
        ax_t.plot(r["train_loss_steps"], np.exp(r["train_loss"]), label=name)
    ax_l.axvline(train_length, color="grey", ls=":", label="training length")
    ax_l.set_xscale("log", base=2)
    ax_l.set_xlabel("evaluation sequence length (tokens)")
    ax_l.set_ylabel("held-out perplexity")
    ax_l.set_title("length generalisation")
    ax_t.set_yscale("log")
    ax_t.set_xlabel("step")
    ax_t.set_ylabel(f"training perplexity ({LOG_EVERY}-step mean)")
    ax_t.set_title(f"training at L = {train_length}, W = {payload['config']['window']}")
    for ax in (ax_l, ax_t):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------------------
# command line and demo


# Command-line flag -> Config field. Flags left out keep the Config default (or, with
# `--small`, the small_config value): an explicit flag always wins.
_FLAGS = {
    "models": "models",
    "train_length": "train_length",
    "window": "window",
    "dim": "dim",
    "layers": "num_layers",
    "heads": "num_heads",
    "bst_layers": "bst_layers",
    "state_size": "state_size",
    "steps": "steps",
    "batch_size": "batch_size",
    "lr": "learning_rate",
    "warmup_steps": "warmup_steps",
    "eval_multipliers": "eval_multipliers",
    "eval_tokens": "eval_tokens",
    "seed": "seed",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = Config()
    flag = lambda name, **kw: parser.add_argument(
        name, default=None, help=f"default {getattr(d, _FLAGS[name[2:].replace('-', '_')])}", **kw
    )
    parser.add_argument("--corpus", default=None, help="text file or directory (default: stdlib)")
    flag("--models", nargs="+", choices=MODELS)
    flag("--train-length", type=int)
    flag("--window", type=int)
    flag("--dim", type=int)
    flag("--layers", type=int)
    flag("--heads", type=int)
    flag("--bst-layers", type=int, nargs="+")
    flag("--state-size", type=int)
    flag("--steps", type=int)
    flag("--batch-size", type=int)
    flag("--lr", type=float)
    flag("--warmup-steps", type=int)
    flag("--eval-multipliers", type=float, nargs="+")
    flag("--eval-tokens", type=int)
    flag("--seed", type=int)
    parser.add_argument("--no-match", action="store_true", help="do not match parameter counts")
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=pathlib.Path(__file__).parents[2] / "benchmarks" / "results",
        help="directory for bst_lm.json/png/md (default: benchmarks/results)",
    )
    parser.add_argument(
        "--small", action="store_true", help="tiny sizes (smoke tests); explicit flags still win"
    )


def config_from_args(args: argparse.Namespace) -> Config:
    """The run's Config: defaults (tiny ones with `--small`), then the flags given."""
    cfg = small_config() if args.small else Config()
    given = {f: getattr(args, n) for n, f in _FLAGS.items() if getattr(args, n) is not None}
    for field in ("models", "bst_layers", "eval_multipliers"):
        if field in given:
            given[field] = tuple(given[field])
    return dataclasses.replace(cfg, match_parameters=not args.no_match, **given)


def run(args: argparse.Namespace) -> int:
    run_experiment(config_from_args(args), args.corpus, args.out)
    return 0


def small_config(cfg: Config | None = None) -> Config:
    """Tiny sizes: every code path in well under a minute."""
    return dataclasses.replace(
        Config() if cfg is None else cfg,
        train_length=256,
        window=64,
        dim=32,
        num_layers=2,
        num_heads=2,
        bst_layers=(1,),
        state_size=8,
        mf_filters=4,
        brect_states=8,
        steps=20,
        batch_size=2,
        warmup_steps=5,
        eval_multipliers=(1.0, 4.0),
        eval_tokens=1024,
    )


def demo(out_dir: pathlib.Path, *, small: bool) -> None:
    """SLIDE vs BST:SH:S4 on the stdlib corpus; perplexity at L and 4L."""
    cfg = Config(
        models=("SLIDE", "BST:SH:S4"),
        train_length=512,
        window=64,
        dim=64,
        num_layers=2,
        num_heads=4,
        steps=120,
        warmup_steps=10,
        eval_multipliers=(1.0, 4.0),
        eval_tokens=8192,
    )
    if small:
        cfg = dataclasses.replace(small_config(cfg), models=cfg.models)
    run_experiment(cfg, None, out_dir)
