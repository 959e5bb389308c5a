"""`python -m lineax_seq bst`: Block-State Transformer language modelling (Table 2.1, Fig. 2.3).

Trains SLIDE, BRECT:FIXED:SKIP, BST:SH:S4, BST:MH:S4 and BST:MF:UNSTRUCT language
models on a code corpus (default: the Python standard library's `.py` sources, byte
tokens) at one training length `L` with window `W`, matched in parameter count and
steps, then measures held-out perplexity at `L/2, L, 4L, 16L` on the *same* held-out
tokens, cut into sequences of each length: the paper's length-generalisation study.
Every model is trained once per seed (initialisation and batch order); the table
reports the mean and standard deviation over seeds, and BST-vs-SLIDE is also compared
seed by seed (the same batches for both).

    python -m lineax_seq bst                          # the committed run (2-core CPU, ~30 min)
    python -m lineax_seq bst --steps 50 --models SLIDE BST:SH:S4
    python -m lineax_seq bst --corpus path/to/texts   # any text corpus (file or directory)

Writes `bst_lm.json`, `bst_lm.png` and `bst_lm.md` (a README table) under `--out`
(default `benchmarks/results/` of the source checkout, or of the current directory when
the package is installed without one); other settings than the default run's add a
suffix (see `output_stem`: the second command above writes `bst_lm_50steps.*`).
"""

import argparse
import contextlib
import dataclasses
import json
import math
import pathlib
import re
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
from jaxtyping import Array, Float, Int

import lineax_seq as ls

from .._checks import check_choice
from ._cli import (
    UsageError,
    corpus_errors,
    existing_path,
    matched_width,
    non_negative_int,
    output_problem,
    path,
    positive_float,
    positive_int,
    random_seed,
    results_dir,
    settings_tag,
)

LOG_EVERY = 5
MODELS = ("SLIDE", "BRECT", "BST:SH:S4", "BST:MH:S4", "BST:MF:UNSTRUCT")


@dataclasses.dataclass(frozen=True)
class Config:
    """Sizes and budget of one run (defaults: the committed CPU run).

    `dt_min = None` initialises the S4D step sizes in `[4 / train_length, dt_max]`: the
    slowest mode's time constant `2 / dt_min` is then half the training length, the
    ratio of S4's usual `dt_min = 1e-3` to the paper's 4k training sequences. Modes
    slower than the training length never settle during training, so their outputs at
    longer lengths lie outside anything the model has seen.
    """

    models: tuple[str, ...] = MODELS
    train_length: int = 1024
    window: int = 128
    dim: int = 128
    num_layers: int = 3
    num_heads: int = 4
    bst_layers: tuple[int, ...] = (1,)
    state_size: int = 16
    dt_min: float | None = None
    dt_max: float = 1e-1
    mf_filters: int = 32
    brect_states: int = 128
    steps: int = 400
    batch_size: int = 2
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    weight_decay: float = 0.01
    eval_multipliers: tuple[float, ...] = (0.5, 1.0, 4.0, 16.0)
    eval_tokens: int = 131072
    match_parameters: bool = True
    seeds: tuple[int, ...] = (0, 1, 2)

    def eval_lengths(self) -> list[int]:
        return [int(self.train_length * m) for m in self.eval_multipliers]

    def ssm_dt_min(self) -> float:
        """`dt_min`, or `4 / train_length` (at most `dt_max / 2`) when it is `None`."""
        if self.dt_min is None:
            return min(4 / self.train_length, self.dt_max / 2)
        return self.dt_min


# --------------------------------------------------------------------------------------
# models


def build_lm(name: str, vocab_size: int, cfg: Config, *, mlp_dim: int, key: jax.Array):
    """The language model `name` (one of `MODELS`) at the sizes of `cfg`.

    All models share the embedding, the stack of sliding-window block transformer
    layers and the tied LM head; they differ only in the layers listed in
    `cfg.bst_layers`: plain (SLIDE), block-recurrent (BRECT, at the last of those
    indices) or Block-State (BST, context and SSM from the name).
    """
    check_choice("model", name, MODELS)
    common: dict[str, Any] = dict(
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
            dt_min=cfg.ssm_dt_min(),
            dt_max=cfg.dt_max,
            num_filters=cfg.mf_filters,
            max_length=cfg.train_length,
        )
    return ls.BlockStateTransformerLM(vocab_size, cfg.dim, cfg.num_layers, **common)


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
        lm = eqx.filter_eval_shape(
            lambda k: build_lm(name, vocab_size, cfg, mlp_dim=mlp_dim, key=k), key
        )
        return ls.count_parameters(lm)

    target = max(size(name, base) for name in cfg.models)
    # Every width a multiple of 8.
    return {
        name: matched_width(lambda w, n=name: size(n, w), base, target, multiple=8)
        for name in cfg.models
    }


# --------------------------------------------------------------------------------------
# data


def train_batches(
    corpus: str | None, tokenizer, cfg: Config, *, seed: int, exclude: Sequence[pathlib.Path] = ()
):
    """`(batch_size, L)` causal-LM windows from the `"train"` split
    ([`lineax_seq.lm_dataset`][]; without the paths in `exclude`), shuffled by `seed`: the
    same order for every model."""
    with _short_documents("the train split", "--train-length", cfg.train_length, "--train-length"):
        return ls.lm_dataset(
            ls.text_corpus(corpus, split="train", exclude=exclude),
            tokenizer,
            length=cfg.train_length,
            batch_size=cfg.batch_size,
            seed=seed,
        )


@contextlib.contextmanager
def _short_documents(split: str, options: str, length: int, smaller: str) -> Iterator[None]:
    """The `ValueError` of windows longer than every document of `split`, named by the
    `options` that set their `length` (the library's message names `length=`), with the
    advice to make `smaller` smaller."""
    try:
        yield
    except ValueError as e:
        if not (found := re.search(r"longest document has (\d+) tokens", str(e))):
            raise
        raise ValueError(
            f"{split} has no document of {options} + 1 = {length + 1} tokens (its longest "
            f"has {found[1]}); use a smaller {smaller}, or more text"
        ) from e


def heldout_windows(
    corpus: str | None, tokenizer, cfg: Config, *, exclude: Sequence[pathlib.Path] = ()
) -> np.ndarray:
    """`cfg.eval_tokens // max(eval_lengths)` windows (at least one) of
    `max(eval_lengths) + 1` tokens, evenly spaced over all the windows tiling the
    documents of the `"valid"` split (without the paths in `exclude`), so they come from
    many files, not the first few; every evaluation length cuts these same windows into
    shorter sequences."""
    longest = max(cfg.eval_lengths())
    valid = ls.text_corpus(corpus, split="valid", exclude=exclude)
    options = "max(--eval-multipliers) x --train-length"
    smaller = "--train-length or --eval-multipliers"
    with _short_documents("the held-out (valid) split", options, longest, smaller):
        windows = ls.lm_windows(valid, tokenizer, length=longest)
    count = min(len(windows), max(1, cfg.eval_tokens // longest))
    picks = np.unique(np.linspace(0, len(windows) - 1, count).round().astype(int))
    return np.stack(
        [np.concatenate([windows[i]["inputs"], windows[i]["targets"][-1:]]) for i in picks]
    )


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


def train_lm(model, batches, cfg: Config, *, name: str = "", seed: int = 0):
    """`cfg.steps` AdamW steps (warmup + cosine decay, clipping) with the library's loop.

    Returns the trained model, the training losses and their steps: one record per
    `LOG_EVERY` steps (the mean over those steps) plus, if `cfg.steps` is not a multiple
    of `LOG_EVERY`, one for the remaining steps (the loop's final flush).
    """
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
        key=jr.key(seed),
        log_every=LOG_EVERY,
        unit="tokens",
        progress=sys.stderr.isatty(),
        callback=_report if not sys.stderr.isatty() else None,
    )
    records = [r for r in result.history if r["split"] == "train"]
    return result.model, [r["loss"] for r in records], [r["step"] for r in records]


def evaluate_lm(model, heldout: np.ndarray, length: int) -> float:
    """Mean next-token NLL (nats) of the held-out windows cut into sequences of `length`.

    `heldout` holds windows of `n + 1` tokens (`n` a multiple of `length`); every
    evaluation length scores exactly the same target tokens, so perplexities at
    different lengths differ only by how much context the model gets and uses.
    """
    n = heldout.shape[1] - 1
    if n % length:
        raise ValueError(f"evaluation length {length} must divide the held-out window {n}")
    loss = eqx.filter_jit(batch_loss)  # one call per window: all its sequences at once
    total = 0.0
    for window in heldout:
        batch = {
            "inputs": jnp.asarray(window[:-1].reshape(-1, length)),
            "targets": jnp.asarray(window[1:].reshape(-1, length)),
        }
        total += float(loss(model, batch))
    return total / heldout.shape[0]


# --------------------------------------------------------------------------------------
# the experiment


def _train_and_evaluate(name: str, model, train_data, heldout, cfg: Config, seed: int) -> dict:
    """One seed of one model: train, then held-out perplexity at every length."""
    start = time.perf_counter()
    try:
        model, losses, loss_steps = train_lm(model, train_data, cfg, name=name, seed=seed)
    except FloatingPointError as e:  # record the divergence, keep the other runs
        print(f"  {name} (seed {seed}) diverged: {e}", flush=True)
        return {"seed": seed, "error": str(e)}
    train_seconds = time.perf_counter() - start
    ppl = {}
    for length in cfg.eval_lengths():
        ppl[str(length)] = math.exp(evaluate_lm(model, heldout, length))
        print(f"  {name} eval L={length:6d}: perplexity {ppl[str(length)]:.3f}", flush=True)
    return {
        "seed": seed,
        "train_seconds": train_seconds,
        "eval_seconds": time.perf_counter() - start - train_seconds,
        "final_train_loss": float(np.mean(losses[-FINAL_LOSS_POINTS:])),
        "train_loss": losses,
        "train_loss_steps": loss_steps,
        "perplexity": ppl,
    }


def _aggregate(params: int, mlp_dim: int, runs: list[dict]) -> dict:
    """A model's entry: its runs, and the mean (and std) over the seeds that trained."""
    out: dict[str, Any] = {"parameters": params, "mlp_dim": mlp_dim, "runs": runs}
    done = [r for r in runs if "perplexity" in r]
    if not done:
        out["error"] = "; ".join(r["error"] for r in runs)
        return out
    lengths = done[0]["perplexity"]
    ppl = {n: [r["perplexity"][n] for r in done] for n in lengths}
    out["perplexity"] = {n: float(np.mean(v)) for n, v in ppl.items()}
    out["perplexity_std"] = {n: float(np.std(v)) for n, v in ppl.items()}
    for field in ("train_seconds", "eval_seconds", "final_train_loss", "train_loss"):
        out[field] = np.mean([r[field] for r in done], axis=0).tolist()
    out["train_loss_steps"] = done[0]["train_loss_steps"]
    return out


FINAL_LOSS_POINTS = 4  # a run's final train loss: the mean of its last logged losses


def config_problem(cfg: Config) -> str | None:
    """What in `cfg` the run cannot use, named by its option, found before any training
    (the models' constructors, the training windows and the evaluation would otherwise
    fail after minutes of it)."""
    multipliers = " ".join(f"{m:g}" for m in cfg.eval_multipliers)
    for m in cfg.eval_multipliers:
        tokens = m * cfg.train_length
        if not 1 <= tokens <= 2**31 or tokens != int(tokens):
            return (
                f"--eval-multipliers {multipliers}: {m:g} x --train-length {cfg.train_length} "
                f"= {tokens:g} must be a whole number of tokens in [1, 2**31]"
            )
    lengths = cfg.eval_lengths()
    repeated = (("--models", cfg.models), ("--seeds", cfg.seeds))
    for flag, values in (*repeated, ("--eval-multipliers", cfg.eval_multipliers)):
        if len(set(values)) < len(values):
            return f"{flag} {' '.join(map(str, values))}: each may be given once"
    if 1.0 not in cfg.eval_multipliers:
        return (
            f"--eval-multipliers {multipliers}: must include 1 (the training length, which "
            "the comparisons are made at)"
        )
    if cfg.train_length % cfg.window:
        return (
            f"--window {cfg.window}: must divide --train-length {cfg.train_length} "
            "(the sequences are cut into windows)"
        )
    for m, n in zip(cfg.eval_multipliers, lengths, strict=True):
        if n < 1 or n % cfg.window or max(lengths) % n:
            return (
                f"--eval-multipliers {multipliers}: {m:g} x --train-length {cfg.train_length} "
                f"= {n} must be a multiple of --window {cfg.window} that divides the longest "
                f"evaluation length {max(lengths)}"
            )
    if cfg.dim % cfg.num_heads:
        return f"--heads {cfg.num_heads}: must divide --dim {cfg.dim}"
    if any(i >= cfg.num_layers for i in cfg.bst_layers):
        return (
            f"--bst-layers {' '.join(map(str, cfg.bst_layers))}: layer indices must be "
            f"below --layers {cfg.num_layers}"
        )
    if cfg.ssm_dt_min() >= cfg.dt_max:
        return f"--dt-min {cfg.ssm_dt_min():g}: must be below --dt-max {cfg.dt_max:g}"
    from lineax_seq import ByteTokenizer

    for name in cfg.models:  # what the constructors refuse (sizes, state size...)
        build = lambda k, name=name: build_lm(
            name, ByteTokenizer().vocab_size, cfg, mlp_dim=4 * cfg.dim, key=k
        )
        try:
            eqx.filter_eval_shape(build, jr.key(0))
        except (ValueError, TypeError) as e:
            return (
                f"--models {name} cannot be built with --dim {cfg.dim} --heads "
                f"{cfg.num_heads} --layers {cfg.num_layers} --state-size {cfg.state_size}: {e}"
            )
    return None


def _short_float(x: float) -> str:
    """`x` exactly enough to tell settings apart, briefly: `1e-3`, `1.4e-3`, `0.05`."""
    if x >= 1e-2:
        return f"{x:.12g}"
    mantissa, exponent = f"{x:.11e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def output_stem(cfg: Config, corpus: str | None) -> str:
    """`bst_lm`, and for settings other than the default run's a suffix, so that they do
    not overwrite its results: `_<N>steps` and `_dt_min_<x>` (the runs the README and
    `benchmarks/RESULTS.md` quote), then a short hash of every other setting that
    differs (at other --steps, the models are left out of it for SLIDE and BST:SH:S4
    only: the README's longer comparison)."""
    if cfg.dt_min is not None and cfg.dt_min == dataclasses.replace(cfg, dt_min=None).ssm_dt_min():
        cfg = dataclasses.replace(cfg, dt_min=None)  # the default range, given explicitly
    default = dataclasses.asdict(Config())
    differ = {k: v for k, v in dataclasses.asdict(cfg).items() if v != default[k]}
    stem = "bst_lm"
    if "steps" in differ:
        stem += f"_{differ.pop('steps')}steps"
        # The README's longer runs compare SLIDE and BST:SH:S4 only: those models get
        # the plain name, any others (all five included) the hash.
        differ["models"] = cfg.models
        if cfg.models == ("SLIDE", "BST:SH:S4"):
            del differ["models"]
    if "dt_min" in differ:
        dt_min = differ.pop("dt_min")
        stem += f"_dt_min_{_short_float(dt_min)}"
    if corpus is not None:
        differ["corpus"] = corpus
    return stem + (f"_{settings_tag(differ)}" if differ else "")


def run_experiment(
    cfg: Config, corpus: str | None, out: pathlib.Path, *, stem: str = "bst_lm"
) -> dict:
    """Train and evaluate every model of `cfg` for every seed; write `<stem>.json`, `.png`
    and `.md` (plot and table)."""
    if not cfg.seeds:
        raise ValueError("seeds must name at least one seed, got seeds=()")

    tokenizer = ls.ByteTokenizer()
    if problem := config_problem(cfg):
        raise UsageError(problem)
    with corpus_errors(corpus):
        heldout = heldout_windows(corpus, tokenizer, cfg, exclude=[out])
    vocab_size = tokenizer.vocab_size
    print(
        f"corpus: train batches of {cfg.batch_size} x {cfg.train_length} tokens; held out "
        f"{heldout.shape[0]} x {heldout.shape[1] - 1} tokens; vocab {vocab_size}; "
        f"seeds {list(cfg.seeds)}",
        flush=True,
    )
    mlp_dims = matched_mlp_dims(vocab_size, cfg)
    runs: dict[str, list[dict]] = {name: [] for name in cfg.models}
    params = {}
    for seed in cfg.seeds:
        with corpus_errors(corpus):
            train_data = train_batches(corpus, tokenizer, cfg, seed=seed, exclude=[out])
        for i, name in enumerate(cfg.models):
            model = build_lm(
                name, vocab_size, cfg, mlp_dim=mlp_dims[name], key=jr.fold_in(jr.key(seed), i)
            )
            params[name] = ls.count_parameters(model)
            print(
                f"{name} (seed {seed}): {params[name] / 1e6:.3f}M parameters "
                f"(MLP {mlp_dims[name]})",
                flush=True,
            )
            runs[name].append(_train_and_evaluate(name, model, train_data, heldout, cfg, seed))
    results = {name: _aggregate(params[name], mlp_dims[name], runs[name]) for name in cfg.models}
    payload = {
        "config": dataclasses.asdict(cfg) | {"dt_min": cfg.ssm_dt_min()},
        "corpus": corpus or "python stdlib (.py sources)",
        "vocab_size": vocab_size,
        "backend": jax.default_backend(),
        "heldout_tokens": int(heldout.shape[0] * (heldout.shape[1] - 1)),
        "eval_lengths": cfg.eval_lengths(),
        "results": results,
    }
    payload["summary"] = summarise(payload)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(payload, indent=2) + "\n")
    (out / f"{stem}.md").write_text(table(payload) + "\n")
    plot(payload, out / f"{stem}.png")
    print(table(payload))
    for line in payload["summary"]["lines"]:
        print(line)
    print(f"wrote {out / stem}.json, {stem}.png, {stem}.md")
    return payload


def _paired_gains(bst: dict, slide: dict, length: str) -> list[float]:
    """Per seed both models trained: `1 - ppl(BST) / ppl(SLIDE)` at `length`."""

    def by_seed(result: dict) -> dict[int, float]:
        return {r["seed"]: r["perplexity"][length] for r in result["runs"] if "perplexity" in r}

    a, b = by_seed(bst), by_seed(slide)
    return [1 - a[seed] / b[seed] for seed in a if seed in b]


def summarise(payload: dict) -> dict:
    """The issue's two goals, checked on the measured perplexities (means over seeds;
    the BST-vs-SLIDE comparison also seed by seed)."""
    lengths = payload["eval_lengths"]
    results = {n: r for n, r in payload["results"].items() if "perplexity" in r}
    at = str(payload["config"]["train_length"])
    lines, out = [], {}
    if "SLIDE" in results:
        slide = results["SLIDE"]
        for name in (n for n in results if n.startswith("BST")):
            gain = 1 - results[name]["perplexity"][at] / slide["perplexity"][at]
            paired = _paired_gains(results[name], slide, at)
            out[f"{name} vs SLIDE at L"] = gain
            out[f"{name} vs SLIDE at L, per seed"] = paired
            wins = sum(g > 0 for g in paired)
            per_seed = " / ".join(f"{100 * g:+.1f}%" for g in paired)
            lines.append(
                f"{name} {'beats' if gain > 0 else 'does NOT beat'} SLIDE at L: "
                f"{results[name]['perplexity'][at]:.3f} vs {slide['perplexity'][at]:.3f} "
                f"({100 * gain:+.1f}%; per seed {per_seed}: better in {wins} of {len(paired)})"
            )
    longest = str(max(lengths))
    times = f"{max(lengths) / payload['config']['train_length']:g}L"
    for name, r in results.items():
        drift = r["perplexity"][longest] / r["perplexity"][at] - 1
        out[f"{name} ppl({times})/ppl(L) - 1"] = drift
        if name == "BST:SH:S4":
            verdict = "within" if abs(drift) <= 0.05 else "NOT within"
            lines.append(
                f"BST:SH:S4 perplexity at {longest} is {verdict} 5% of its value at L "
                f"({100 * drift:+.1f}%)"
            )
    out["lines"] = lines
    return out


def table(payload: dict) -> str:
    """Markdown table: parameters, perplexity at every length (mean ± std over seeds),
    drift, final training loss (nats, mean of the last 4 logged records, on batches the
    model had not seen before its update), train time (mean per seed)."""
    lengths = payload["eval_lengths"]
    train_length = payload["config"]["train_length"]
    head = ["model", "params"] + [
        f"ppl @ {n}" + (" (L)" if n == train_length else "") for n in lengths
    ]
    trained = [r for r in payload["results"].values() if "train_loss_steps" in r]
    logged = trained[0]["train_loss_steps"] if trained else [0]
    # The steps final_train_loss averages over: its last FINAL_LOSS_POINTS log intervals.
    n = FINAL_LOSS_POINTS
    last = logged[-1] - (logged[-n - 1] if len(logged) > n else 0)
    head += [f"{max(lengths)} / L", f"train loss (last {last} steps)", "train s"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    multi = len(payload["config"].get("seeds", ())) > 1
    for name, r in payload["results"].items():
        if "perplexity" not in r:
            rows.append(f"| {name} | {r['parameters'] / 1e6:.2f}M | diverged |")
            continue
        ppl, std = r["perplexity"], r.get("perplexity_std", {})
        cells = [name, f"{r['parameters'] / 1e6:.2f}M"]
        for n in lengths:
            cells.append(f"{ppl[str(n)]:.3f}" + (f" ± {std[str(n)]:.2f}" if multi else ""))
        cells += [f"{ppl[str(max(lengths))] / ppl[str(train_length)]:.3f}"]
        cells += [f"{r['final_train_loss']:.3f}" if "final_train_loss" in r else "-"]
        cells += [f"{r['train_seconds']:.0f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot(payload: dict, path: pathlib.Path) -> None:
    """Perplexity against evaluation length (Fig. 2.3) and the training curves."""
    from matplotlib.figure import Figure

    lengths = payload["eval_lengths"]
    train_length = payload["config"]["train_length"]
    fig = Figure(figsize=(11, 4.2))
    ax_l, ax_t = fig.subplots(1, 2)
    for name, r in payload["results"].items():
        if "perplexity" not in r:
            continue
        std = r.get("perplexity_std", {})
        ax_l.errorbar(
            lengths,
            [r["perplexity"][str(n)] for n in lengths],
            yerr=[std.get(str(n), 0.0) for n in lengths],
            fmt="o-",
            capsize=3,
            label=name,
        )
        steps = r["train_loss_steps"]  # (one record, at few steps: a marker shows it)
        ax_t.plot(steps, np.exp(r["train_loss"]), marker="." if len(steps) == 1 else "", label=name)
    ax_l.axvline(train_length, color="grey", ls=":", label="training length")
    ax_l.set_xscale("log", base=2)
    ax_l.set_xlabel("evaluation sequence length (tokens)")
    ax_l.set_ylabel("held-out perplexity")
    ax_l.set_title("length generalisation")
    ax_t.set_yscale("log")
    ax_t.set_xlabel("step")
    ax_t.set_ylabel(f"training perplexity ({LOG_EVERY}-step mean, mean over seeds)")
    ax_t.set_title(f"training at L = {train_length}, W = {payload['config']['window']}")
    for ax in (ax_l, ax_t):
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # (none if every run diverged)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


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
    "dt_min": "dt_min",
    "dt_max": "dt_max",
    "steps": "steps",
    "batch_size": "batch_size",
    "lr": "learning_rate",
    "warmup_steps": "warmup_steps",
    "eval_multipliers": "eval_multipliers",
    "eval_tokens": "eval_tokens",
    "seeds": "seeds",
}


_HELP = {
    "models": "models to train, in this order; each model's initial weights come from "
    "--seeds and its position in this list",
    "train_length": "training sequence length L, in tokens",
    "window": "block / attention window W; divides L",
    "dim": "embedding size",
    "layers": "number of layers",
    "heads": "attention heads; divides --dim",
    "bst_layers": "indices of the layers with an SSM and context states (BST) or the "
    "recurrent cell (BRECT: the last index)",
    "state_size": "S4D state size N (even)",
    "dt_max": "largest initial S4D step size",
    "steps": "training steps per model and seed",
    "batch_size": "sequences per training batch",
    "lr": "peak learning rate (AdamW, warmup then cosine decay)",
    "warmup_steps": "learning-rate warmup steps",
    "eval_multipliers": "evaluation lengths as multiples of L; must include 1",
    "eval_tokens": "held-out tokens scored at every evaluation length (rounded down to "
    "whole windows of the longest length, at least one, and at most what the held-out "
    "split holds)",
    "seeds": "seeds (initialisation and batch order); results are mean and std over them",
}


def _shown(value) -> str:
    """A default as the command line writes it: space-separated for lists."""
    return " ".join(map(str, value)) if isinstance(value, tuple) else str(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d, small = Config(), small_config()

    def flag(name, **kw):
        dest = name[2:].replace("-", "_")
        field = _FLAGS[dest]
        default = f"default {_shown(getattr(d, field))}"
        if getattr(small, field) != getattr(d, field):
            default += f"; --small: {_shown(getattr(small, field))}"
        parser.add_argument(name, default=None, help=f"{_HELP[dest]} ({default})", **kw)

    parser.add_argument(
        "--corpus",
        type=existing_path,
        default=None,
        help='a .txt / .py file, a .jsonl file (a document per line, its text in a "text" '
        "field) or a directory of such files, --out skipped (default: the stdlib .py "
        "sources)",
    )
    flag("--models", nargs="+", choices=MODELS)
    flag("--train-length", type=positive_int)
    flag("--window", type=positive_int)
    flag("--dim", type=positive_int)
    flag("--layers", type=positive_int)
    flag("--heads", type=positive_int)
    flag("--bst-layers", type=non_negative_int, nargs="+")
    flag("--state-size", type=positive_int)
    parser.add_argument(
        "--dt-min",
        type=positive_float,
        default=None,
        help="smallest initial S4D step size (default 4 / L, at most --dt-max / 2)",
    )
    flag("--dt-max", type=positive_float)
    flag("--steps", type=positive_int)
    flag("--batch-size", type=positive_int)
    flag("--lr", type=positive_float)
    flag("--warmup-steps", type=non_negative_int)
    flag("--eval-multipliers", type=positive_float, nargs="+")
    flag("--eval-tokens", type=positive_int)
    flag("--seeds", type=random_seed, nargs="+")
    parser.add_argument("--no-match", action="store_true", help="do not match parameter counts")
    parser.add_argument(
        "--out",
        type=path,
        default=results_dir(),
        help="directory for bst_lm.json/png/md, with a suffix for settings other than the "
        "default run's (_<N>steps, _dt_min_<x>, then a short hash of the others) (default: "
        "the checkout's benchmarks/results, else ./benchmarks/results)",
    )
    parser.add_argument(
        "--small",
        action="store_true",
        help="tiny sizes for smoke tests (each option's help gives its --small value); "
        "explicit options still win",
    )


def config_from_args(args: argparse.Namespace) -> Config:
    """The run's Config: defaults (tiny ones with `--small`), then the flags given."""
    cfg = small_config() if args.small else Config()
    given = {f: getattr(args, n) for n, f in _FLAGS.items() if getattr(args, n) is not None}
    for field in ("models", "bst_layers", "eval_multipliers", "seeds"):
        if field in given:
            given[field] = tuple(given[field])
    return dataclasses.replace(cfg, match_parameters=not args.no_match, **given)


_OUTPUTS = (".json", ".md", ".png")  # written after the training, under `--out`


def run(args: argparse.Namespace) -> int:
    """Check the options and `--out` (usage errors, before any training), then run."""
    corpus = None if args.corpus is None else str(args.corpus)
    cfg = config_from_args(args)
    stem = output_stem(cfg, corpus)
    for problem in (
        output_problem("--out", args.out),
        *(output_problem("--out", args.out / f"{stem}{ext}", directory=False) for ext in _OUTPUTS),
    ):
        if problem:
            raise UsageError(problem)
    run_experiment(cfg, corpus, args.out, stem=stem)
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
        seeds=(0,),
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
        seeds=(0,),
    )
    if small:
        cfg = dataclasses.replace(small_config(cfg), models=cfg.models)
    run_experiment(cfg, None, out_dir)
