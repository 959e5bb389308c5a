"""`python -m lineax_seq bigs ...`: BiGS masked-LM pretraining, fine-tuning, the Table 1
ablation and the Figure 3 kernel analysis (Wang et al., "Pretraining Without Attention").

Subcommands:

* `pretrain` — MLM (BERT masking, no next-sentence prediction) on a text corpus (default:
  the Python standard library's `.py` sources), AdamW (beta2 0.98, eps 1e-6), linear warmup
  then cosine decay, the SSM parameters in their own group; checkpoints with `--resume`,
  and `--init-from` to continue pretraining at a longer length (kernels are generated for
  any length).
* `finetune` — sequence classification / regression from a pretrained checkpoint, on a
  (text, label) CSV/JSONL file or on generated ListOps (`--task listops`).
* `ablation` — a small-scale Table 1: GATED/SSM, STACK/SSM, GATED/ATT and STACK/ATT at
  matched parameters and tokens -> MLM loss and a fine-tuning accuracy.
* `kernels` — Figure 3: heat map of each layer's forward/backward SSM kernel over relative
  positions -10..10.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import optax
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

import lineax_seq as ls

# Relative positions shown in the kernel heat maps (Figure 3 crops -10..10).
KERNEL_RADIUS = 10
# The four rows of the paper's Table 1 (architecture, routing), BiGS first.
VARIANTS = (("gated", "ssm"), ("stack", "ssm"), ("gated", "attention"), ("stack", "attention"))
VARIANT_NAMES = {
    ("gated", "ssm"): "GATED / SSM (BiGS)",
    ("stack", "ssm"): "STACK / SSM",
    ("gated", "attention"): "GATED / ATT",
    ("stack", "attention"): "STACK / ATT (BERT)",
}
RESULTS_DIR = pathlib.Path(__file__).parents[2] / "benchmarks" / "results"


# ---------------------------------------------------------------------------------------
# Corpus-derived fine-tuning task (deterministic): does segment B continue segment A?
# ---------------------------------------------------------------------------------------


def continuation_rows(
    texts: Sequence[str],
    *,
    num_rows: int,
    chars: int,
    seed: int = 0,
    separator: str = "\n#|#\n",
) -> list[tuple[str, int]]:
    """A two-segment classification task built deterministically from a corpus.

    Each row is `A + separator + B` where `A` is `chars` characters of one document and
    `B` is either the `chars` characters that follow `A` in the same document (label 1)
    or `chars` characters from a different document (label 0). Labels alternate, so the
    task is exactly balanced; solving it needs interactions *between* the two segments
    (shared identifiers, indentation, topic), the pair structure of MNLI/QNLI/QQP.

    **Arguments:**

    - `texts`: the documents; only those with at least `2 * chars` characters are used.
    - `num_rows`: how many rows to make.
    - `chars`: characters per segment.
    - `seed`: the row sampler's seed (same texts + same seed -> same rows).
    - `separator`: the string between the two segments.

    **Returns:**

    A list of `(text, label)` pairs, `label` in `{0, 1}`.
    """
    if chars < 1:
        raise ValueError(f"`chars` must be at least 1, got {chars}")
    if num_rows < 0:
        raise ValueError(f"`num_rows` must be non-negative, got {num_rows}")
    docs = [t for t in texts if len(t) >= 2 * chars]
    if len(docs) < 2:
        raise ValueError(
            f"need at least 2 documents with >= 2 * chars = {2 * chars} characters, "
            f"got {len(docs)} of {len(texts)}"
        )
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(num_rows):
        d = int(rng.integers(len(docs)))
        start = int(rng.integers(len(docs[d]) - 2 * chars + 1))
        a = docs[d][start : start + chars]
        label = i % 2
        if label:
            b = docs[d][start + chars : start + 2 * chars]
        else:
            e = int(rng.integers(len(docs) - 1))
            e += e >= d  # any other document
            s = int(rng.integers(len(docs[e]) - chars + 1))
            b = docs[e][s : s + chars]
        rows.append((a + separator + b, label))
    return rows


def write_rows(rows: Sequence[tuple[str, float | int]], path: pathlib.Path) -> pathlib.Path:
    """Write `(text, label)` rows as a CSV file with a `text,label` header."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    return path


# ---------------------------------------------------------------------------------------
# Baselines
# ---------------------------------------------------------------------------------------


def unigram_baseline(
    train_tokens: np.ndarray, targets: np.ndarray, vocab_size: int
) -> tuple[float, float]:
    """Cross-entropy and accuracy of predicting every masked token from unigram counts.

    The context-free baseline an MLM must beat: the distribution of tokens in
    `train_tokens` (add-one smoothed), scored on `targets`.

    **Arguments:**

    - `train_tokens`: integer token ids the counts are taken from (any shape).
    - `targets`: the token ids to predict (any shape).
    - `vocab_size`: the number of token ids.

    **Returns:**

    `(loss, accuracy)`: mean negative log-likelihood in nats, and the fraction of
    targets equal to the most frequent token.
    """
    counts = np.bincount(np.ravel(train_tokens), minlength=vocab_size).astype(np.float64) + 1.0
    log_p = np.log(counts / counts.sum())
    targets = np.ravel(targets)
    if targets.size == 0:
        raise ValueError("`targets` is empty")
    return float(-log_p[targets].mean()), float(np.mean(targets == np.argmax(counts)))


# ---------------------------------------------------------------------------------------
# Figure 3: kernel heat maps
# ---------------------------------------------------------------------------------------


def kernel_image(
    forward: np.ndarray, backward: np.ndarray, *, radius: int = KERNEL_RADIUS
) -> np.ndarray:
    """Figure 3's picture of a model's routing: |kernel| over relative positions.

    Row `2i` is layer `i`'s forward kernel (it reads the past: relative positions
    `-radius..0`), row `2i + 1` its backward kernel (the future: `0..radius`); the other
    half of each row is NaN. Each layer's two rows are min-max scaled together, as in
    the paper.

    **Arguments:**

    - `forward`, `backward`: `(layers, length)` or `(layers, channels, length)` kernels,
        lag 0 first; per-channel kernels are averaged in absolute value.
    - `radius`: the largest |relative position| shown.

    **Returns:**

    A `(2 * layers, 2 * radius + 1)` array in `[0, 1]` with NaN where undefined; column
    `j` is relative position `j - radius`.
    """
    forward, backward = np.abs(np.asarray(forward)), np.abs(np.asarray(backward))
    if forward.ndim == 3:
        forward, backward = forward.mean(axis=1), backward.mean(axis=1)
    if forward.ndim != 2 or forward.shape != backward.shape:
        raise ValueError(
            "`forward` and `backward` must both have shape (layers, length) or "
            f"(layers, channels, length), got {forward.shape} and {backward.shape}"
        )
    if forward.shape[1] < radius + 1:
        raise ValueError(f"kernels of length {forward.shape[1]} are too short for radius {radius}")
    layers = forward.shape[0]
    image = np.full((2 * layers, 2 * radius + 1), np.nan)
    image[0::2, : radius + 1] = forward[:, radius::-1]  # lag r at relative position -r
    image[1::2, radius:] = backward[:, : radius + 1]  # lag r at relative position +r
    pairs = image.reshape(layers, 2, -1)
    low = np.nanmin(pairs, axis=(1, 2), keepdims=True)
    high = np.nanmax(pairs, axis=(1, 2), keepdims=True)
    pairs = (pairs - low) / np.where(high > low, high - low, 1.0)
    return pairs.reshape(2 * layers, -1)


def plot_kernels(
    panels: dict[str, tuple[np.ndarray, np.ndarray]],
    path: pathlib.Path,
    *,
    radius: int = KERNEL_RADIUS,
) -> pathlib.Path:
    """Save Figure-3-style heat maps, one panel per model.

    **Arguments:**

    - `panels`: `{title: (forward, backward)}` with kernels as in
        [`kernel_image`][lineax_seq.experiments._bigs.kernel_image].
    - `path`: the PNG to write.
    - `radius`: the largest |relative position| shown.

    **Returns:**

    `path`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not panels:
        raise ValueError("`panels` is empty: no model with SSM routing to plot")
    images = {title: kernel_image(f, b, radius=radius) for title, (f, b) in panels.items()}
    rows = max(image.shape[0] for image in images.values())
    fig, axes = plt.subplots(
        1,
        len(images),
        figsize=(4.4 * len(images), 1.2 + 0.32 * rows),
        squeeze=False,
        layout="constrained",
    )
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#eeeeee")
    for ax, (title, image) in zip(axes[0], images.items(), strict=True):
        im = ax.imshow(image, aspect="auto", cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
        layers = image.shape[0] // 2
        ax.set_yticks(range(2 * layers))
        ax.set_yticklabels([f"L{i} {d}" for i in range(layers) for d in ("fwd", "bwd")])
        ticks = list(range(0, 2 * radius + 1, max(1, radius // 2)))
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t - radius) for t in ticks])
        ax.set_xlabel("relative position (past < 0 < future)")
        ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=axes[0].tolist(), label="|K| (min-max per layer)", shrink=0.8)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------
# Ablation bookkeeping
# ---------------------------------------------------------------------------------------


def ablation_table(results: Sequence[dict[str, Any]]) -> str:
    """The ablation results as a Markdown table (the README section)."""
    lines = [
        "| Arch / Route | params (non-emb.) | tokens | MLM loss | MLM acc. | fine-tune acc. |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['name']} | {r['params']:,} ({r['params_non_embedding']:,}) "
            f"| {r['tokens']:,} | {r['mlm_loss']:.3f} | {r['mlm_accuracy']:.3f} "
            f"| {r['finetune_accuracy']:.3f} |"
        )
    return "\n".join(lines)


def plot_ablation(results: Sequence[dict[str, Any]], path: pathlib.Path) -> pathlib.Path:
    """Save the ablation figure: MLM training curves, eval MLM loss, fine-tune accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    names = [r["name"] for r in results]
    colors = [f"C{i}" for i in range(len(results))]
    for r, c in zip(results, colors, strict=True):
        curve = np.asarray(r.get("mlm_curve", []), dtype=float).reshape(-1, 2)
        if curve.size:
            axes[0].plot(curve[:, 0], curve[:, 1], color=c, label=r["name"])
    axes[0].set_xlabel("pretraining step")
    axes[0].set_ylabel("MLM train loss (smoothed)")
    axes[0].legend(fontsize=8)
    for ax, key, label in (
        (axes[1], "mlm_loss", "held-out MLM loss (lower is better)"),
        (axes[2], "finetune_accuracy", "fine-tune accuracy (higher is better)"),
    ):
        values = [r[key] for r in results]
        ax.bar(range(len(values)), values, color=colors)
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
        ax.set_title(label, fontsize=10)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.3f}", ha="center", va="bottom", fontsize=8)
        low = min(values)
        ax.set_ylim(low - 0.1 * abs(low) if key == "mlm_loss" else 0.0, None)
    fig.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def smooth_curve(losses: Sequence[float], *, points: int = 100) -> list[list[float]]:
    """Average a per-step loss list into at most `points` `[step, mean loss]` pairs."""
    losses = np.asarray(losses, dtype=float)
    if losses.size == 0:
        return []
    chunks = np.array_split(np.arange(losses.size), min(points, losses.size))
    return [[float(c[-1] + 1), float(losses[c].mean())] for c in chunks]


@dataclasses.dataclass(frozen=True)
class _Timer:
    start: float = dataclasses.field(default_factory=time.perf_counter)

    def __call__(self) -> float:
        return time.perf_counter() - self.start


def _fmt_seconds(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _is_integer_labels(labels: Sequence[float]) -> bool:
    return all(float(x).is_integer() for x in labels) and not any(math.isnan(x) for x in labels)


def _save_json(payload: dict[str, Any], path: pathlib.Path) -> pathlib.Path:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


# ---------------------------------------------------------------------------------------
# Models and losses
# ---------------------------------------------------------------------------------------


class MaskedLM(eqx.Module):
    """A BiGS-family encoder with the masked-LM head (decoder tied to the embedding)."""

    encoder: ls.BiGS
    head: ls.MaskedLMHead

    def __init__(self, encoder: ls.BiGS, *, key: PRNGKeyArray):
        self.encoder = encoder
        self.head = ls.MaskedLMHead(encoder.dim, encoder.vocab_size, key=key)

    def __call__(
        self,
        tokens: Int[Array, " length"],
        mask: Bool[Array, " length"],
        positions: Int[Array, " n"],
        *,
        key: PRNGKeyArray | None = None,
        inference: bool = False,
    ) -> Float[Array, "n vocab"]:
        """Vocabulary logits at `positions` only (the masked ones): the tied decoder is
        the largest matrix product, so it is applied to the predicted tokens alone."""
        h = self.encoder(tokens, mask, key=key, inference=inference)
        return self.head(h[positions], self.encoder.token_embedding.weight)


class Classifier(eqx.Module):
    """A BiGS-family encoder with a sequence classification/regression head."""

    encoder: ls.BiGS
    head: ls.SequenceClassificationHead

    def __init__(self, encoder: ls.BiGS, num_outputs: int, *, key: PRNGKeyArray):
        self.encoder = encoder
        self.head = ls.SequenceClassificationHead(
            encoder.dim, num_outputs, dropout=encoder.dropout_rate, key=key
        )

    def __call__(
        self,
        tokens: Int[Array, " length"],
        mask: Bool[Array, " length"],
        *,
        key: PRNGKeyArray | None = None,
        inference: bool = False,
    ) -> Float[Array, " outputs"]:
        """Logits (or the regression value) of one sequence."""
        k1, k2 = (None, None) if key is None else jr.split(key)
        h = self.encoder(tokens, mask, key=k1, inference=inference)
        return self.head(h, mask, key=k2, inference=inference)


def max_predictions(length: int, mask_rate: float) -> int:
    """Masked positions scored per sequence: the mean `rate * length` plus six standard
    deviations of the binomial count (more than that is astronomically rare and the
    surplus would simply not be scored)."""
    mean = mask_rate * length
    return min(length, math.ceil(mean + 6 * math.sqrt(mean * (1 - mask_rate)) + 1))


def mlm_loss(
    model: MaskedLM,
    batch: dict[str, Array],
    key: PRNGKeyArray,
    *,
    max_masked: int,
    inference: bool = False,
) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
    """Mean cross-entropy over the masked tokens of a batch, and their accuracy.

    **Arguments:**

    - `model`: a [`MaskedLM`][lineax_seq.experiments._bigs.MaskedLM].
    - `batch`: `tokens` (batch, length) ids with the masking applied, `mask` (batch,
        length) `True` at real tokens, `targets` (batch, length) the original id at
        masked positions and `-1` elsewhere.
    - `key`: dropout key.
    - `max_masked`: predictions scored per sequence (see `max_predictions`).
    - `inference`: disable dropout.

    **Returns:**

    `(loss, {"accuracy": ...})`, averaged over all masked tokens of the batch.
    """
    tokens, mask, targets = batch["tokens"], batch["mask"], batch["targets"]

    def one(tokens, mask, targets, key):
        is_target = targets >= 0
        (positions,) = jnp.nonzero(is_target, size=max_masked, fill_value=0)
        valid = jnp.arange(max_masked) < jnp.sum(is_target)
        logits = model(tokens, mask, positions, key=key, inference=inference)
        labels = jnp.where(valid, targets[positions], 0)
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        hit = valid & (jnp.argmax(logits, axis=-1) == labels)
        return jnp.sum(jnp.where(valid, nll, 0.0)), jnp.sum(hit), jnp.sum(valid)

    keys = jr.split(key, tokens.shape[0])
    nll, hits, count = jax.vmap(one)(tokens, mask, targets, keys)
    count = jnp.maximum(jnp.sum(count), 1).astype(jnp.float32)
    loss = jnp.sum(nll) / count
    return loss, {"accuracy": jnp.sum(hits).astype(jnp.float32) / count}


def classification_loss(
    model: Classifier,
    batch: dict[str, Array],
    key: PRNGKeyArray,
    *,
    inference: bool = False,
) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
    """Cross-entropy and accuracy (integer `labels`) or squared error (float `labels`,
    regression with one output) of a batch of `tokens`/`mask`/`labels`."""
    keys = jr.split(key, batch["tokens"].shape[0])
    call = lambda t, m, k: model(t, m, key=k, inference=inference)
    out = jax.vmap(call)(batch["tokens"], batch["mask"], keys)
    labels = batch["labels"]
    if jnp.issubdtype(labels.dtype, jnp.floating):
        err = out[:, 0] - labels
        return jnp.mean(err**2), {"mae": jnp.mean(jnp.abs(err))}
    loss = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(out, labels))
    accuracy = jnp.mean((jnp.argmax(out, axis=-1) == labels).astype(jnp.float32))
    return loss, {"accuracy": accuracy}


def ssm_parameter_paths(model: PyTree) -> frozenset[str]:
    """`jax.tree_util.keystr` paths of every S4D kernel parameter (A, B, C, dt) in a model:
    the SSM parameter group (own learning rate, no weight decay, as S4 trains them)."""
    is_kernel = lambda x: isinstance(x, ls.S4DKernel)
    paths = set()
    for path, node in jtu.tree_flatten_with_path(model, is_leaf=is_kernel)[0]:
        if is_kernel(node):
            for sub, leaf in jtu.tree_flatten_with_path(node)[0]:
                if eqx.is_inexact_array(leaf):
                    paths.add(jtu.keystr((*path, *sub)))
    return frozenset(paths)


def make_optimizer(
    model: PyTree,
    *,
    lr: float,
    steps: int,
    warmup: float,
    weight_decay: float,
    ssm_lr: float,
    schedule: str = "cosine",
) -> optax.GradientTransformation:
    """The paper's pretraining optimiser (Table 7): AdamW with beta1 0.9, beta2 0.98,
    eps 1e-6, no gradient clipping, linear warmup over a fraction `warmup` of `steps`
    then `schedule` decay to 0; SSM kernel parameters in their own group (`ssm_lr`, no
    weight decay; capped at `lr` so the group never outruns the warmup peak)."""
    paths = ssm_parameter_paths(model)
    groups = {}
    if paths:
        groups["ssm"] = ls.ParamGroup(
            match=lambda path, _: path in paths,
            learning_rate=min(ssm_lr, lr) if ssm_lr > 0 else lr,
            weight_decay=0.0,
        )
    warmup_steps = min(max(int(round(warmup * steps)), 0), max(steps - 1, 0))
    return ls.make_optimizer(
        lr,
        schedule=schedule,
        warmup_steps=warmup_steps,
        total_steps=max(steps, warmup_steps + 1),
        weight_decay=weight_decay,
        b1=0.9,
        b2=0.98,
        eps=1e-6,
        clip_norm=None,
        groups=groups,
    )


def _count(tree: PyTree) -> int:
    # Like `ls.count_parameters`, but also counts `jax.ShapeDtypeStruct` leaves, so that
    # models built abstractly with `eqx.filter_eval_shape` can be sized for free.
    leaves = jax.tree.leaves(tree)
    return sum(
        int(np.prod(x.shape))
        for x in leaves
        if hasattr(x, "dtype") and hasattr(x, "shape") and jnp.issubdtype(x.dtype, jnp.inexact)
    )


def parameter_counts(model: PyTree) -> dict[str, int]:
    """Total parameters and those outside the token/position/type embeddings."""
    encoder = model.encoder if hasattr(model, "encoder") else model
    embeddings = (
        encoder.token_embedding,
        encoder.position_embedding,
        encoder.token_type_embedding,
    )
    total = _count(model)
    return {"params": total, "params_non_embedding": total - _count(embeddings)}


def matched_inner_dim(config: dict[str, Any], target: int) -> int:
    """The `inner_dim` giving the encoder `config` closest to `target` non-embedding
    parameters (the count is affine in `inner_dim`; measured, not assumed)."""

    def count(inner: int) -> int:
        enc = eqx.filter_eval_shape(
            lambda: ls.BiGS(**{**config, "inner_dim": inner}, key=jr.key(0))
        )
        return parameter_counts(enc)["params_non_embedding"]

    base = config["dim"]
    c1, c2 = count(base), count(2 * base)
    slope = (c2 - c1) / base
    return max(8, int(round(base + (target - c1) / slope)))


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------


def _model_arguments(parser: argparse.ArgumentParser, *, layers: int, dim: int) -> None:
    g = parser.add_argument_group("model (ignored with --init-from/--resume: the checkpoint's)")
    g.add_argument("--architecture", choices=("gated", "stack"), default="gated")
    g.add_argument("--routing", choices=("ssm", "attention"), default="ssm")
    g.add_argument("--dim", type=int, default=dim, help=f"hidden size d (default {dim})")
    g.add_argument("--layers", type=int, default=layers, help=f"layers (default {layers})")
    g.add_argument(
        "--inner", type=int, default=None, help="inner width (default 3d gated, 4d stack)"
    )
    g.add_argument("--heads", type=int, default=4, help="attention heads (routing=attention)")
    g.add_argument("--state-size", type=int, default=64, help="SSM state size N (default 64)")
    g.add_argument("--dropout", type=float, default=0.1)


def _optim_arguments(
    parser: argparse.ArgumentParser, *, lr: float, steps: int, batch: int, length: int
) -> None:
    g = parser.add_argument_group("optimisation (AdamW, beta2 0.98, eps 1e-6)")
    g.add_argument("--steps", type=int, default=steps, help=f"optimiser steps (default {steps})")
    g.add_argument("--batch-size", type=int, default=batch, help=f"default {batch}")
    g.add_argument("--length", type=int, default=length, help=f"sequence length ({length})")
    g.add_argument("--lr", type=float, default=lr, help=f"peak learning rate (default {lr:g})")
    g.add_argument(
        "--ssm-lr",
        type=float,
        default=1e-3,
        help="peak learning rate of the SSM parameter group, no weight decay (default 1e-3)",
    )
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument(
        "--warmup", type=float, default=0.01, help="warmup fraction of the steps (default 0.01)"
    )
    g.add_argument("--schedule", choices=("cosine", "linear"), default="cosine")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: end)")


def _corpus_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("corpus")
    g.add_argument(
        "--corpus",
        type=pathlib.Path,
        default=None,
        help="a text file or a directory of text files (default: the stdlib .py sources)",
    )
    g.add_argument("--max-files", type=int, default=400, help="use at most N files (400)")
    g.add_argument("--tokenizer", choices=("bpe", "byte"), default="bpe")
    g.add_argument("--vocab-size", type=int, default=2048, help="BPE vocabulary (2048)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `bigs pretrain | finetune | ablation | kernels` on `parser`."""
    sub = parser.add_subparsers(dest="bigs_command", required=True, metavar="SUBCOMMAND")

    pre = sub.add_parser(
        "pretrain",
        help="masked-LM pretraining on a text corpus",
        description="Masked-LM pretraining (15%% masking, 80/10/10, no NSP).",
    )
    _corpus_arguments(pre)
    _model_arguments(pre, layers=4, dim=128)
    _optim_arguments(pre, lr=1e-3, steps=2000, batch=32, length=128)
    pre.add_argument("--out", type=pathlib.Path, default=pathlib.Path("outputs/bigs/pretrain"))
    pre.add_argument("--mask-rate", type=float, default=0.15)
    init = pre.add_mutually_exclusive_group()
    init.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its checkpoint"
    )
    init.add_argument(
        "--init-from",
        type=pathlib.Path,
        default=None,
        help="start from this pretraining run's weights, e.g. at a longer --length",
    )

    fin = sub.add_parser(
        "finetune",
        help="classification/regression from a pretrained checkpoint",
        description="Fine-tune a pretrained BiGS on a (text, label) file or on ListOps.",
    )
    fin.add_argument(
        "--checkpoint", type=pathlib.Path, required=True, help="a `bigs pretrain --out` dir"
    )
    fin.add_argument("--task", choices=("file", "listops"), default="file")
    fin.add_argument("--train", type=pathlib.Path, help="(text, label) CSV or JSONL file")
    fin.add_argument("--eval", type=pathlib.Path, help="held-out file (default: 10%% of --train)")
    fin.add_argument(
        "--regression", action="store_true", help="real-valued labels (default: classes)"
    )
    fin.add_argument("--listops-examples", type=int, default=4000)
    _optim_arguments(fin, lr=3e-4, steps=500, batch=32, length=128)
    fin.add_argument("--out", type=pathlib.Path, default=pathlib.Path("outputs/bigs/finetune"))

    abl = sub.add_parser(
        "ablation",
        help="the Table 1 ablation at small scale",
        description="GATED/SSM, STACK/SSM, GATED/ATT, STACK/ATT at matched parameters and "
        "tokens: held-out MLM loss and a fine-tuning accuracy.",
    )
    _corpus_arguments(abl)
    abl.add_argument("--dim", type=int, default=128)
    abl.add_argument("--layers", type=int, default=4)
    abl.add_argument("--length", type=int, default=128)
    abl.add_argument("--batch-size", type=int, default=32)
    abl.add_argument("--steps", type=int, default=600, help="pretraining steps per model")
    abl.add_argument("--lr", type=float, default=1e-3)
    abl.add_argument("--finetune-task", choices=("continuation", "listops"), default="continuation")
    abl.add_argument("--finetune-steps", type=int, default=300)
    abl.add_argument("--finetune-lr", type=float, default=3e-4)
    abl.add_argument("--seed", type=int, default=0)
    abl.add_argument("--quick", action="store_true", help="tiny sizes, a smoke run")
    abl.add_argument(
        "--out",
        type=pathlib.Path,
        default=RESULTS_DIR,
        help="where bigs_ablation.json/png and bigs_kernels.png go (benchmarks/results)",
    )

    ker = sub.add_parser(
        "kernels",
        help="Figure 3: forward/backward kernel heat map of a checkpoint",
        description="Heat map of every layer's forward/backward SSM kernel over relative "
        "positions -radius..radius (min-max scaled |K| per layer).",
    )
    ker.add_argument("--checkpoint", type=pathlib.Path, required=True, nargs="+")
    ker.add_argument("--radius", type=int, default=KERNEL_RADIUS)
    ker.add_argument("--out", type=pathlib.Path, default=pathlib.Path("outputs/bigs/kernels.png"))


# ---------------------------------------------------------------------------------------
# Data (thin adapters over lineax_seq.data)
# ---------------------------------------------------------------------------------------


class _Tokens:
    """Temporary byte-level tokenizer (replaced by lineax_seq.data's)."""

    pad, cls, sep, mask = 0, 1, 2, 3
    offset = 4
    vocab_size = 260

    def encode(self, text: str) -> list[int]:
        return [b + self.offset for b in text.encode("utf-8", "replace")]

    def save(self, path: pathlib.Path) -> None:
        pathlib.Path(path).write_text(json.dumps({"kind": "byte"}))


def _load_texts(corpus: pathlib.Path | None, max_files: int) -> list[str]:
    import sysconfig

    root = pathlib.Path(sysconfig.get_paths()["stdlib"]) if corpus is None else corpus
    files = [root] if root.is_file() else sorted(root.rglob("*.py" if corpus is None else "*"))
    files = [f for f in files if "site-packages" not in f.parts and f.is_file()]
    texts = []
    for f in files[:max_files]:
        try:
            texts.append(f.read_text())
        except (UnicodeDecodeError, OSError):
            continue
    return texts


def _tokenizer(texts: Sequence[str], kind: str, vocab_size: int) -> _Tokens:
    del texts, kind, vocab_size
    return _Tokens()


def _load_tokenizer(run_dir: pathlib.Path) -> _Tokens:
    return _Tokens()


def _split_documents(texts: Sequence[str], held_out: float = 0.05) -> tuple[list, list]:
    """Deterministic document-level split: every `1 / held_out`-th document is held out."""
    every = max(2, round(1 / held_out))
    train = [t for i, t in enumerate(texts) if i % every != every - 1]
    test = [t for i, t in enumerate(texts) if i % every == every - 1]
    return train, test


def _mlm_batches(
    texts: Sequence[str],
    tok: _Tokens,
    *,
    length: int,
    batch_size: int,
    mask_rate: float,
    seed: int,
    num_batches: int | None = None,
):
    """MLM batches `{tokens, mask, targets}` of windows of the token stream."""
    stream = np.concatenate([np.asarray(tok.encode(t), np.int32) for t in texts])
    rng = np.random.default_rng(seed)
    i = 0
    while num_batches is None or i < num_batches:
        starts = rng.integers(0, len(stream) - length, size=batch_size)
        orig = np.stack([stream[s : s + length] for s in starts])
        chosen = rng.random(orig.shape) < mask_rate
        r = rng.random(orig.shape)
        tokens = np.where(chosen & (r < 0.8), tok.mask, orig)
        rand = rng.integers(tok.offset, tok.vocab_size, size=orig.shape)
        tokens = np.where(chosen & (r >= 0.8) & (r < 0.9), rand, tokens).astype(np.int32)
        yield {
            "tokens": tokens,
            "mask": np.ones_like(tokens, dtype=bool),
            "targets": np.where(chosen, orig, -1).astype(np.int32),
        }
        i += 1


def _encode_rows(
    rows: Sequence[tuple[str, float]], tok: _Tokens, *, length: int, regression: bool
) -> dict[str, np.ndarray]:
    tokens = np.full((len(rows), length), tok.pad, np.int32)
    mask = np.zeros((len(rows), length), bool)
    for i, (text, _) in enumerate(rows):
        ids = [tok.cls, *tok.encode(text)][:length]
        tokens[i, : len(ids)] = ids
        mask[i, : len(ids)] = True
    labels = np.asarray([y for _, y in rows], np.float32 if regression else np.int32)
    return {"tokens": tokens, "mask": mask, "labels": labels}


def _read_rows(path: pathlib.Path) -> list[tuple[str, float]]:
    path = pathlib.Path(path)
    if path.suffix == ".jsonl":
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [(r["text"], float(r["label"])) for r in records]
    with path.open(newline="") as f:
        return [(r["text"], float(r["label"])) for r in csv.DictReader(f)]


def _listops_rows(num: int, *, seed: int) -> list[tuple[str, float]]:
    raise NotImplementedError("ListOps lands with lineax_seq.data")


def _batches(data: dict[str, np.ndarray], batch_size: int, *, seed: int | None):
    """Epochs of shuffled batches (`seed`), or one ordered pass (`seed=None`)."""
    n = len(data["labels"])
    rng = None if seed is None else np.random.default_rng(seed)
    while True:
        order = np.arange(n) if rng is None else rng.permutation(n)
        for i in range(0, n - batch_size + 1 if rng is not None else n, batch_size):
            idx = order[i : i + batch_size]
            yield {k: v[idx] for k, v in data.items()}
        if rng is None:
            return


class _Reiterable:
    """`iter()` restarts a generator function (what `train`'s `eval_data` wants)."""

    def __init__(self, fn):
        self.fn = fn

    def __iter__(self):
        return iter(self.fn())


# ---------------------------------------------------------------------------------------
# Runs: build, pretrain, fine-tune, save/load
# ---------------------------------------------------------------------------------------

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
FINAL_DIR = "final"


def _save_run(out: pathlib.Path, model: eqx.Module, step: int, config: dict) -> None:
    _save_json(config, out / CONFIG_FILE)
    ls.save_checkpoint(out / FINAL_DIR, step, model=model, keep=1)


def load_pretrained(run_dir: pathlib.Path) -> tuple[MaskedLM, Any, dict[str, Any]]:
    """Load a finished `bigs pretrain` run: the MLM model, its tokenizer and config."""
    run_dir = pathlib.Path(run_dir)
    if not (run_dir / CONFIG_FILE).exists():
        raise ValueError(f"{run_dir} is not a `bigs pretrain` output (no {CONFIG_FILE})")
    config = json.loads((run_dir / CONFIG_FILE).read_text())
    template = eqx.filter_eval_shape(
        lambda: MaskedLM(ls.BiGS(**config["model"], key=jr.key(0)), key=jr.key(1))
    )
    model = ls.load_checkpoint(run_dir / FINAL_DIR, model=template).model
    return model, _load_tokenizer(run_dir), config


def _print_metrics(prefix: str, metrics: dict[str, float]) -> None:
    shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
    print(f"{prefix}: {shown}", flush=True)


def _last(history: list[dict], split: str) -> dict[str, float]:
    records = [r for r in history if r.get("split") == split]
    if not records:
        return {}
    return {k: v for k, v in records[-1].items() if k not in ("step", "split")}


def pretrain_mlm(
    model: MaskedLM,
    train_texts: Sequence[str],
    eval_texts: Sequence[str],
    tok: Any,
    *,
    steps: int,
    batch_size: int,
    length: int,
    lr: float,
    ssm_lr: float = 1e-3,
    weight_decay: float = 0.01,
    warmup: float = 0.01,
    schedule: str = "cosine",
    mask_rate: float = 0.15,
    eval_batches: int = 8,
    eval_every: int = 0,
    seed: int = 0,
    out_dir: pathlib.Path | None = None,
    checkpoint_every: int = 0,
    resume: bool = False,
    progress: bool = True,
) -> ls.TrainResult:
    """Masked-LM pretraining of `model` with the paper's optimiser (see `make_optimizer`).

    Evaluates on `eval_batches` fixed batches of `eval_texts` (same batches for every
    model with the same seed) at the end and every `eval_every` steps.
    """
    max_masked = max_predictions(length, mask_rate)
    loss = lambda m, b, k: mlm_loss(m, b, k, max_masked=max_masked)
    eval_loss = lambda m, b, k: mlm_loss(m, b, k, max_masked=max_masked, inference=True)
    data = _mlm_batches(
        train_texts, tok, length=length, batch_size=batch_size, mask_rate=mask_rate, seed=seed
    )
    eval_data = _Reiterable(
        lambda: _mlm_batches(
            eval_texts,
            tok,
            length=length,
            batch_size=batch_size,
            mask_rate=mask_rate,
            seed=10_000 + seed,
            num_batches=eval_batches,
        )
    )
    optimizer = make_optimizer(
        model,
        lr=lr,
        steps=steps,
        warmup=warmup,
        weight_decay=weight_decay,
        ssm_lr=ssm_lr,
        schedule=schedule,
    )
    return ls.train(
        model,
        optimizer,
        loss,
        data,
        steps=steps,
        key=jr.key(seed),
        eval_data=eval_data,
        eval_fn=eval_loss,
        eval_every=eval_every,
        log_every=max(1, min(25, steps // 20)),
        out_dir=out_dir,
        checkpoint_every=checkpoint_every,
        resume=resume,
        unit="tokens",
        progress=progress,
        plot=out_dir is not None,
    )


def finetune_classifier(
    model: Classifier,
    train_data: dict[str, np.ndarray],
    eval_data: dict[str, np.ndarray],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    ssm_lr: float = 1e-3,
    weight_decay: float = 0.01,
    warmup: float = 0.1,
    seed: int = 0,
    out_dir: pathlib.Path | None = None,
    progress: bool = True,
) -> ls.TrainResult:
    """Fine-tune a classifier (Table 8's recipe: AdamW, 10% warmup, linear decay) and
    evaluate it on all of `eval_data` at the end."""
    if len(train_data["labels"]) < batch_size:
        raise ValueError(
            f"the training set has {len(train_data['labels'])} examples, fewer than "
            f"batch_size={batch_size}"
        )
    optimizer = make_optimizer(
        model,
        lr=lr,
        steps=steps,
        warmup=warmup,
        weight_decay=weight_decay,
        ssm_lr=ssm_lr,
        schedule="linear",
    )
    return ls.train(
        model,
        optimizer,
        classification_loss,
        _batches(train_data, batch_size, seed=seed),
        steps=steps,
        key=jr.key(seed),
        eval_data=_Reiterable(lambda: _batches(eval_data, batch_size, seed=None)),
        eval_fn=lambda m, b, k: classification_loss(m, b, k, inference=True),
        log_every=max(1, min(25, steps // 20)),
        out_dir=out_dir,
        progress=progress,
        plot=out_dir is not None,
    )


def model_kernels(
    model: MaskedLM | Classifier | ls.BiGS, length: int
) -> tuple[np.ndarray, np.ndarray]:
    """`(forward, backward)` kernels of every layer, each `(layers, kc, length)`."""
    encoder = model if isinstance(model, ls.BiGS) else model.encoder
    k = np.asarray(encoder.kernels(length))
    return k[:, 0], k[:, 1]


# ---------------------------------------------------------------------------------------
# Subcommands
# ---------------------------------------------------------------------------------------


def pretrain(args: argparse.Namespace) -> dict[str, Any]:
    """`bigs pretrain`: MLM pretraining; writes config, tokenizer, checkpoints, metrics,
    curves, the final model and (SSM routing) the kernel heat map into `--out`."""
    out: pathlib.Path = args.out
    texts = _load_texts(args.corpus, args.max_files)
    train_texts, eval_texts = _split_documents(texts)
    if args.resume:
        if not (out / CONFIG_FILE).exists():
            raise ValueError(f"--resume: {out} holds no run to resume (no {CONFIG_FILE})")
        config = json.loads((out / CONFIG_FILE).read_text())
        tok = _load_tokenizer(out)
        model = MaskedLM(ls.BiGS(**config["model"], key=jr.key(args.seed)), key=jr.key(1))
    elif args.init_from is not None:
        model, tok, config = load_pretrained(args.init_from)
        config = {**config, "init_from": str(args.init_from)}
    else:
        tok = _tokenizer(train_texts, args.tokenizer, args.vocab_size)
        encoder = ls.BiGS(
            tok.vocab_size,
            args.dim,
            args.layers,
            architecture=args.architecture,
            routing=args.routing,
            inner_dim=args.inner,
            num_heads=args.heads if args.routing == "attention" else None,
            max_length=args.length if args.routing == "attention" else None,
            state_size=args.state_size,
            dropout=args.dropout,
            key=jr.key(args.seed),
        )
        model = MaskedLM(encoder, key=jr.fold_in(jr.key(args.seed), 1))
        config = {"model": encoder.config()}
    out.mkdir(parents=True, exist_ok=True)
    tok.save(out / TOKENIZER_FILE)
    config["pretrain"] = {
        k: str(v) if isinstance(v, pathlib.Path) else v
        for k, v in vars(args).items()
        if k not in ("func",)
    }
    _save_json(config, out / CONFIG_FILE)
    counts = parameter_counts(model)
    print(
        f"BiGS {config['model']['architecture']}/{config['model']['routing']}: "
        f"{counts['params']:,} parameters ({counts['params_non_embedding']:,} non-embedding), "
        f"{len(train_texts)} training documents, length {args.length}",
        flush=True,
    )
    result = pretrain_mlm(
        model,
        train_texts,
        eval_texts,
        tok,
        steps=args.steps,
        batch_size=args.batch_size,
        length=args.length,
        lr=args.lr,
        ssm_lr=args.ssm_lr,
        weight_decay=args.weight_decay,
        warmup=args.warmup,
        schedule=args.schedule,
        mask_rate=args.mask_rate,
        eval_every=args.eval_every,
        seed=args.seed,
        out_dir=out,
        checkpoint_every=max(1, args.steps // 4),
        resume=args.resume,
    )
    _save_run(out, result.model, result.step, config)
    metrics = _last(result.history, "eval")
    _print_metrics("held-out MLM", metrics)
    if result.model.encoder.routing == "ssm":
        fwd, bwd = model_kernels(result.model, max(args.length, 2 * KERNEL_RADIUS + 1))
        path = plot_kernels({"pretrained": (fwd, bwd)}, out / "kernels.png")
        print(f"kernels: {path}")
    print(f"model, checkpoints and metrics in {out}/")
    return metrics


def finetune(args: argparse.Namespace) -> dict[str, Any]:
    """`bigs finetune`: classification/regression from a `bigs pretrain` run."""
    mlm, tok, config = load_pretrained(args.checkpoint)
    if args.task == "listops":
        rows = _listops_rows(args.listops_examples, seed=args.seed)
        cut = int(0.9 * len(rows))
        train_rows, eval_rows = rows[:cut], rows[cut:]
        regression = False
    else:
        if args.train is None:
            raise ValueError("--task file needs --train PATH (a CSV or JSONL file)")
        train_rows = _read_rows(args.train)
        if args.eval is not None:
            eval_rows = _read_rows(args.eval)
        else:
            cut = int(0.9 * len(train_rows))
            train_rows, eval_rows = train_rows[:cut], train_rows[cut:]
        regression = args.regression
        if not regression and not _is_integer_labels([y for _, y in train_rows]):
            raise ValueError("labels are not integers: pass --regression for real values")
    num_outputs = 1 if regression else int(max(y for _, y in train_rows + eval_rows)) + 1
    encode = lambda rows: _encode_rows(rows, tok, length=args.length, regression=regression)
    model = Classifier(mlm.encoder, num_outputs, key=jr.key(args.seed + 1))
    print(
        f"fine-tuning {args.checkpoint} on {len(train_rows)} examples "
        f"({'regression' if regression else f'{num_outputs} classes'}), "
        f"{len(eval_rows)} held out",
        flush=True,
    )
    result = finetune_classifier(
        model,
        encode(train_rows),
        encode(eval_rows),
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        ssm_lr=args.ssm_lr,
        weight_decay=args.weight_decay,
        warmup=args.warmup,
        seed=args.seed,
        out_dir=args.out,
    )
    metrics = _last(result.history, "eval")
    _print_metrics("held-out", metrics)
    _save_json(
        {"checkpoint": str(args.checkpoint), "task": args.task, **metrics}, args.out / "result.json"
    )
    if result.model.encoder.routing == "ssm":
        fwd, bwd = model_kernels(result.model, max(args.length, 2 * KERNEL_RADIUS + 1))
        pre_fwd, pre_bwd = model_kernels(mlm, max(args.length, 2 * KERNEL_RADIUS + 1))
        plot_kernels(
            {"pretrained": (pre_fwd, pre_bwd), "fine-tuned": (fwd, bwd)},
            args.out / "kernels.png",
        )
    return metrics


def kernels(args: argparse.Namespace) -> pathlib.Path:
    """`bigs kernels`: Figure 3 heat map of one or more pretraining runs."""
    panels = {}
    for run_dir in args.checkpoint:
        model, _, config = load_pretrained(run_dir)
        if model.encoder.routing != "ssm":
            print(f"skipping {run_dir}: routing={model.encoder.routing!r} has no kernels")
            continue
        length = max(128, 2 * args.radius + 1)
        arch = config["model"]["architecture"].upper()
        panels[f"{run_dir.name} ({arch}/SSM)"] = model_kernels(model, length)
    path = plot_kernels(panels, args.out, radius=args.radius)
    print(f"kernel heat map: {path}")
    return path


def ablation(args: argparse.Namespace) -> dict[str, Any]:
    raise NotImplementedError


def run(args: argparse.Namespace) -> int:
    """Dispatch `python -m lineax_seq bigs <subcommand>`."""
    commands = {
        "pretrain": pretrain,
        "finetune": finetune,
        "ablation": ablation,
        "kernels": kernels,
    }
    commands[args.bigs_command](args)
    return 0


def demo(out_dir: pathlib.Path, *, small: bool) -> None:
    raise NotImplementedError
