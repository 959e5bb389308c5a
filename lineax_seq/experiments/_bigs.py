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
) -> list[tuple[str, str, int]]:
    """A two-segment classification task built deterministically from a corpus.

    Each row is `(A, B, label)` where `A` is `chars` characters of one document and
    `B` is either the `chars` characters that follow `A` in the same document (label 1)
    or `chars` characters from a different document (label 0). Labels alternate, so the
    task is exactly balanced; solving it needs interactions *between* the two segments
    (shared identifiers, indentation, topic), the pair structure of MNLI/QNLI/QQP.

    **Arguments:**

    - `texts`: the documents; only those with at least `2 * chars` characters are used.
    - `num_rows`: how many rows to make.
    - `chars`: characters per segment.
    - `seed`: the row sampler's seed (same texts + same seed -> same rows).

    **Returns:**

    A list of `(text, text_pair, label)` triples, `label` in `{0, 1}` (encoded by
    [`lineax_seq.classification_dataset`][] as `<cls> A <sep> B <sep>`).
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
        rows.append((a, b, label))
    return rows


def write_rows(rows: Sequence[tuple], path: pathlib.Path) -> pathlib.Path:
    """Write `(text, label)` or `(text, text_pair, label)` rows as a CSV file with a
    `text,label` / `text,text_pair,label` header (what `bigs finetune --train` reads)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "text_pair", "label"] if len(rows[0]) == 3 else ["text", "label"])
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


def build_encoder(key: PRNGKeyArray, **config: Any) -> ls.BiGS:
    """`ls.BiGS(**config, key=key)`, built as one compiled program (op-by-op
    construction of the stacked layers compiles dozens of small XLA programs)."""
    return eqx.filter_jit(lambda k: ls.BiGS(**config, key=k))(key)


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
    batch: dict[str, Any],
    key: PRNGKeyArray,
    *,
    max_masked: int,
    inference: bool = False,
) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
    """Mean cross-entropy over the masked tokens of a batch, and their accuracy.

    **Arguments:**

    - `model`: a [`MaskedLM`][lineax_seq.experiments._bigs.MaskedLM].
    - `batch`: as [`lineax_seq.mlm_dataset`][] makes it: `tokens` (batch, length) ids
        with the masking applied, `padding_mask` (batch, length) `True` at real tokens,
        `labels` (batch, length) the original id at masked positions, negative
        (`lineax_seq.IGNORE_INDEX`) elsewhere.
    - `key`: dropout key.
    - `max_masked`: predictions scored per sequence (see `max_predictions`).
    - `inference`: disable dropout.

    **Returns:**

    `(loss, {"accuracy": ...})`, averaged over all masked tokens of the batch.
    """
    tokens, mask, targets = batch["tokens"], batch["padding_mask"], batch["labels"]

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
    batch: dict[str, Any],
    key: PRNGKeyArray,
    *,
    inference: bool = False,
) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
    """Cross-entropy and accuracy (integer `label`) or squared error (float `label`,
    regression with one output) of a batch of `tokens`/`padding_mask`/`label`, as
    [`lineax_seq.classification_dataset`][] makes it."""
    keys = jr.split(key, batch["tokens"].shape[0])
    call = lambda t, m, k: model(t, m, key=k, inference=inference)
    out = jax.vmap(call)(batch["tokens"], batch["padding_mask"], keys)
    labels = batch["label"]
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
# Data (over lineax_seq.data)
# ---------------------------------------------------------------------------------------


def _subsample(dataset: Any, max_files: int | None) -> list[str]:
    """At most `max_files` documents, evenly spaced over the (id-sorted) corpus, so a
    small run still sees every part of it rather than its alphabetical start."""
    n = len(dataset)
    if max_files is None or max_files >= n:
        return [dataset[i] for i in range(n)]
    return [dataset[int(i)] for i in np.linspace(0, n - 1, max_files)]


def load_corpus(corpus: pathlib.Path | None, max_files: int | None) -> tuple[list[str], list[str]]:
    """`(train, held-out)` documents of a corpus (default: the stdlib `.py` sources),
    split by [`lineax_seq.text_corpus`][]'s stable hash; `max_files` caps the train
    documents (and a twentieth of it the held-out ones)."""
    train = _subsample(ls.text_corpus(corpus, split="train"), max_files)
    valid = ls.text_corpus(corpus, split="valid")
    return train, _subsample(valid, None if max_files is None else max(10, max_files // 10))


def make_tokenizer(texts: Sequence[str], kind: str, vocab_size: int) -> ls.Tokenizer:
    """A byte-level tokenizer, or BPE trained on `texts` with `vocab_size` tokens."""
    if kind == "byte":
        return ls.ByteTokenizer()
    if kind == "bpe":
        return ls.BPETokenizer.train(texts, vocab_size=vocab_size)
    raise ValueError(f"tokenizer must be 'bpe' or 'byte', got {kind!r}")


def _save_tokenizer(tok: ls.Tokenizer, run_dir: pathlib.Path) -> str:
    if isinstance(tok, ls.BPETokenizer):
        tok.save(run_dir / TOKENIZER_FILE)
        return "bpe"
    return "byte"


def _load_tokenizer(run_dir: pathlib.Path, kind: str) -> ls.Tokenizer:
    return ls.BPETokenizer.load(run_dir / TOKENIZER_FILE) if kind == "bpe" else ls.ByteTokenizer()


def _mlm_data(
    texts: Sequence[str],
    tok: ls.Tokenizer,
    *,
    length: int,
    batch_size: int,
    mask_rate: float,
    seed: int,
    train: bool,
) -> Any:
    """Masked-LM batches: shuffled with dynamic masking, forever (`train`), or one
    ordered pass with fixed masking (held-out data: the same batches for every model)."""
    if train:
        return ls.mlm_dataset(
            texts, tok, length=length, batch_size=batch_size, mask_prob=mask_rate, seed=seed
        )
    return ls.mlm_dataset(
        texts,
        tok,
        length=length,
        batch_size=batch_size,
        mask_prob=mask_rate,
        masking="fixed",
        seed=seed,
        shuffle=False,
        num_epochs=1,
    )


def _records(rows: Sequence[tuple]) -> Any:
    """`(text, label)` or `(text, text_pair, label)` rows as a grain dataset of records."""
    import grain

    def record(row: tuple) -> dict[str, Any]:
        if len(row) == 3:
            return {"text": row[0], "text_pair": row[1], "label": row[2]}
        return {"text": row[0], "label": row[1]}

    return grain.MapDataset.source([record(r) for r in rows])


def _classification_data(
    records: Any, tok: ls.Tokenizer, *, length: int, batch_size: int, seed: int, train: bool
) -> Any:
    if train:
        return ls.classification_dataset(
            records, tok, length=length, batch_size=batch_size, seed=seed
        )
    return ls.classification_dataset(
        records,
        tok,
        length=length,
        batch_size=batch_size,
        shuffle=False,
        num_epochs=1,
        drop_remainder=False,
    )


def _read_rows(path: pathlib.Path, *, regression: bool) -> tuple[Any, int]:
    """A (text, label) CSV/JSONL file (optional `text_pair` column) as records, via
    [`lineax_seq.read_classification`][], and the number of outputs (classes, or 1 for
    regression)."""
    path = pathlib.Path(path)
    with path.open(newline="", encoding="utf-8") as f:
        if path.suffix == ".jsonl":
            first = next((json.loads(line) for line in f if line.strip()), {})
            fields = first if isinstance(first, dict) else {}
        else:
            fields = next(csv.reader(f), [])
    pair = "text_pair" if "text_pair" in fields else None
    records = ls.read_classification(path, num_classes=None, pair_field=pair)
    if regression:
        return records, 1
    labels = [records[i]["label"] for i in range(len(records))]
    if not _is_integer_labels(labels):
        raise ValueError(f"{path}: labels are not integers; pass --regression for real values")
    num_classes = max(2, int(max(labels)) + 1)
    return ls.read_classification(path, num_classes=num_classes, pair_field=pair), num_classes


def _split_records(records: Any, fraction: float = 0.1) -> tuple[Any, Any]:
    """Deterministic split of a record dataset: every `1 / fraction`-th record held out."""
    import grain

    every = max(2, round(1 / fraction))
    items = [records[i] for i in range(len(records))]
    train = [r for i, r in enumerate(items) if i % every != every - 1]
    held = [r for i, r in enumerate(items) if i % every == every - 1]
    return grain.MapDataset.source(train), grain.MapDataset.source(held)


def _listops_records(num: int, *, seed: int, tok: ls.Tokenizer, length: int) -> Any:
    """ListOps expressions short enough to fit `length` tokens of `tok` (the pretrained
    model's tokenizer, not ListOps' own: the fine-tuned model keeps its vocabulary)."""
    sample = ls.listops(64, seed=seed, min_length=8, max_length=64)
    texts = [sample[i]["text"] for i in range(len(sample))]
    per_symbol = sum(len(tok.encode(t)) for t in texts) / sum(len(t.split()) for t in texts)
    max_symbols = max(8, int((length - 2) / per_symbol))
    return ls.listops(num, seed=seed, min_length=max(4, max_symbols // 4), max_length=max_symbols)


# ---------------------------------------------------------------------------------------
# Runs: build, pretrain, fine-tune, save/load
# ---------------------------------------------------------------------------------------

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
FINAL_DIR = "final"


def load_pretrained(run_dir: pathlib.Path) -> tuple[MaskedLM, ls.Tokenizer, dict[str, Any]]:
    """Load a finished `bigs pretrain` run: the MLM model, its tokenizer and config."""
    run_dir = pathlib.Path(run_dir)
    if not (run_dir / CONFIG_FILE).exists():
        raise ValueError(f"{run_dir} is not a `bigs pretrain` output (no {CONFIG_FILE})")
    config = json.loads((run_dir / CONFIG_FILE).read_text())
    template = eqx.filter_eval_shape(
        lambda: MaskedLM(ls.BiGS(**config["model"], key=jr.key(0)), key=jr.key(1))
    )
    model = ls.load_checkpoint(run_dir / FINAL_DIR, model=template).model
    return model, _load_tokenizer(run_dir, config["tokenizer"]), config


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
    tok: ls.Tokenizer,
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
    """Masked-LM pretraining of `model` with the paper's optimiser (see `make_optimizer`)
    on [`lineax_seq.mlm_dataset`][] batches (dynamic masking, no next-sentence task).

    Evaluates on the first `eval_batches` batches of `eval_texts` (fixed masks, no
    shuffling: the same batches for every model) at the end and every `eval_every`.
    """
    max_masked = max_predictions(length, mask_rate)
    loss = lambda m, b, k: mlm_loss(m, b, k, max_masked=max_masked)
    eval_loss = lambda m, b, k: mlm_loss(m, b, k, max_masked=max_masked, inference=True)
    common = dict(length=length, batch_size=batch_size, mask_rate=mask_rate)
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
        _mlm_data(train_texts, tok, seed=seed, train=True, **common),
        steps=steps,
        key=jr.key(seed),
        eval_data=_mlm_data(eval_texts, tok, seed=seed, train=False, **common),
        eval_fn=eval_loss,
        eval_every=eval_every,
        eval_batches=eval_batches,
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
    train_records: Any,
    eval_records: Any,
    tok: ls.Tokenizer,
    *,
    length: int,
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
    """Fine-tune a classifier or regressor (Table 8's recipe: AdamW, 10% warmup, linear
    decay) on records `{"text"[, "text_pair"], "label"}` and evaluate on all of
    `eval_records` at the end."""
    if len(train_records) < batch_size:
        raise ValueError(
            f"the training set has {len(train_records)} examples, fewer than "
            f"batch_size={batch_size}"
        )
    common = dict(length=length, batch_size=batch_size, seed=seed)
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
        _classification_data(train_records, tok, train=True, **common),
        steps=steps,
        key=jr.key(seed),
        eval_data=_classification_data(eval_records, tok, train=False, **common),
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
    train_texts, eval_texts = load_corpus(args.corpus, args.max_files)
    if args.resume:
        if not (out / CONFIG_FILE).exists():
            raise ValueError(f"--resume: {out} holds no run to resume (no {CONFIG_FILE})")
        config = json.loads((out / CONFIG_FILE).read_text())
        tok = _load_tokenizer(out, config["tokenizer"])
        model = MaskedLM(build_encoder(jr.key(args.seed), **config["model"]), key=jr.key(1))
    elif args.init_from is not None:
        model, tok, config = load_pretrained(args.init_from)
        config = {**config, "init_from": str(args.init_from)}
    else:
        tok = make_tokenizer(train_texts, args.tokenizer, args.vocab_size)
        encoder = build_encoder(
            jr.key(args.seed),
            vocab_size=tok.vocab_size,
            dim=args.dim,
            num_layers=args.layers,
            architecture=args.architecture,
            routing=args.routing,
            inner_dim=args.inner,
            num_heads=args.heads if args.routing == "attention" else None,
            max_length=args.length if args.routing == "attention" else None,
            state_size=args.state_size,
            dropout=args.dropout,
        )
        model = MaskedLM(encoder, key=jr.fold_in(jr.key(args.seed), 1))
        config = {"model": encoder.config()}
    out.mkdir(parents=True, exist_ok=True)
    config["tokenizer"] = _save_tokenizer(tok, out)
    config["pretrain"] = {
        k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()
    }
    _save_json(config, out / CONFIG_FILE)
    counts = parameter_counts(model)
    print(
        f"BiGS {config['model']['architecture']}/{config['model']['routing']}: "
        f"{counts['params']:,} parameters ({counts['params_non_embedding']:,} non-embedding), "
        f"vocabulary {tok.vocab_size}, {len(train_texts)} training documents, "
        f"length {args.length}",
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
    ls.save_checkpoint(
        out / FINAL_DIR, result.step, model=result.model, key=jr.key(args.seed), keep=1
    )
    metrics = _last(result.history, "eval")
    _print_metrics("held-out MLM", metrics)
    if result.model.encoder.routing == "ssm":
        fwd, bwd = model_kernels(result.model, max(args.length, 2 * KERNEL_RADIUS + 1))
        print(f"kernels: {plot_kernels({'pretrained': (fwd, bwd)}, out / 'kernels.png')}")
    print(f"model, checkpoints and metrics in {out}/")
    return metrics


def finetune(args: argparse.Namespace) -> dict[str, Any]:
    """`bigs finetune`: classification/regression from a `bigs pretrain` run."""
    mlm, tok, _ = load_pretrained(args.checkpoint)
    if args.task == "listops":
        records = _listops_records(
            args.listops_examples, seed=args.seed, tok=tok, length=args.length
        )
        train_records, eval_records = _split_records(records)
        num_outputs = 10
    else:
        if args.train is None:
            raise ValueError("--task file needs --train PATH (a CSV or JSONL file)")
        train_records, num_outputs = _read_rows(args.train, regression=args.regression)
        if args.eval is not None:
            eval_records, eval_outputs = _read_rows(args.eval, regression=args.regression)
            num_outputs = max(num_outputs, eval_outputs)
        else:
            train_records, eval_records = _split_records(train_records)
    model = Classifier(mlm.encoder, num_outputs, key=jr.key(args.seed + 1))
    kind = "regression" if num_outputs == 1 else f"{num_outputs} classes"
    print(
        f"fine-tuning {args.checkpoint} ({args.task}, {kind}): {len(train_records)} "
        f"training / {len(eval_records)} held-out examples, length {args.length}",
        flush=True,
    )
    result = finetune_classifier(
        model,
        train_records,
        eval_records,
        tok,
        length=args.length,
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
    summary = {"checkpoint": str(args.checkpoint), "task": args.task, **metrics}
    _save_json(summary, args.out / "result.json")
    if result.model.encoder.routing == "ssm":
        length = max(args.length, 2 * KERNEL_RADIUS + 1)
        panels = {
            "pretrained": model_kernels(mlm, length),
            "fine-tuned": model_kernels(result.model, length),
        }
        plot_kernels(panels, args.out / "kernels.png")
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


def _chars_per_token(texts: Sequence[str], tok: ls.Tokenizer, *, sample: int = 20_000) -> float:
    text = "".join(texts)[:sample]
    return len(text) / max(1, len(tok.encode(text)))


def _finetune_task(
    task: str,
    train_texts: Sequence[str],
    eval_texts: Sequence[str],
    tok: ls.Tokenizer,
    *,
    length: int,
    num_train: int,
    num_eval: int,
    seed: int,
) -> tuple[Any, Any, int, str]:
    """The ablation's fine-tuning task as `(train records, eval records, classes, name)`:
    corpus continuation (train rows from pretraining documents, eval rows from held-out
    ones) or ListOps."""
    if task == "listops":
        records = _listops_records(num_train + num_eval, seed=seed, tok=tok, length=length)
        import grain

        items = [records[i] for i in range(len(records))]
        train = grain.MapDataset.source(items[:num_train])
        return train, grain.MapDataset.source(items[num_train:]), 10, "ListOps (10 classes)"
    # Two segments that together fill ~90% of the sequence after tokenisation.
    chars = max(8, int(0.45 * (length - 3) * _chars_per_token(train_texts, tok)))
    train = continuation_rows(train_texts, num_rows=num_train, chars=chars, seed=seed + 1)
    held = continuation_rows(eval_texts, num_rows=num_eval, chars=chars, seed=seed + 2)
    name = f"corpus continuation (2 x {chars} characters, 2 classes)"
    return _records(train), _records(held), 2, name


def _ablation_settings(args: argparse.Namespace) -> dict[str, Any]:
    names = (
        "dim",
        "layers",
        "length",
        "batch_size",
        "steps",
        "lr",
        "warmup",
        "finetune_task",
        "finetune_steps",
        "finetune_lr",
        "finetune_examples",
        "seed",
        "max_files",
        "tokenizer",
        "vocab_size",
    )
    settings = {k: getattr(args, k) for k in names}
    if args.quick:
        settings.update(
            dim=32,
            layers=2,
            length=64,
            batch_size=8,
            steps=30,
            finetune_steps=20,
            finetune_examples=64,
            max_files=min(args.max_files, 40),
            vocab_size=min(args.vocab_size, 512),
        )
    return settings


def ablation(args: argparse.Namespace) -> dict[str, Any]:
    """`bigs ablation`: the paper's Table 1 at small scale.

    The four (architecture, routing) variants are pretrained on the same batches with
    the same optimiser for the same number of tokens, at matched non-embedding
    parameter counts (same depth and width; each variant's inner width is solved for to
    match GATED/SSM with the paper's `3d`), then each is fine-tuned on the same task.
    Writes `bigs_ablation.json`, `bigs_ablation.png` and `bigs_kernels.png` to `--out`.
    """
    cfg = _ablation_settings(args)
    timer = _Timer()
    train_texts, eval_texts = load_corpus(args.corpus, cfg["max_files"])
    tok = make_tokenizer(train_texts, cfg["tokenizer"], cfg["vocab_size"])
    length, batch_size = cfg["length"], cfg["batch_size"]
    num_eval = batch_size * max(1, cfg["finetune_examples"] // (4 * batch_size))
    ft_train, ft_eval, num_classes, task_name = _finetune_task(
        cfg["finetune_task"],
        train_texts,
        eval_texts,
        tok,
        length=length,
        num_train=cfg["finetune_examples"],
        num_eval=num_eval,
        seed=cfg["seed"],
    )
    base = dict(vocab_size=tok.vocab_size, dim=cfg["dim"], num_layers=cfg["layers"])
    target = parameter_counts(eqx.filter_eval_shape(lambda: ls.BiGS(**base, key=jr.key(0))))
    print(
        f"Table 1 ablation: d={cfg['dim']}, {cfg['layers']} layers, length {length}, "
        f"vocabulary {tok.vocab_size}, {cfg['steps']} x {batch_size} sequences of "
        f"pretraining; fine-tuning: {task_name}, {len(ft_train)} training / "
        f"{len(ft_eval)} held-out examples",
        flush=True,
    )
    results, kernel_panels = [], {}
    for architecture, routing in VARIANTS:
        name = VARIANT_NAMES[architecture, routing]
        config = dict(
            base,
            architecture=architecture,
            routing=routing,
            # Attention needs absolute positions (BERT's); the SSM kernels are positional.
            max_length=length if routing == "attention" else None,
        )
        config["inner_dim"] = matched_inner_dim(config, target["params_non_embedding"])
        key = jr.key(cfg["seed"])
        mlm = MaskedLM(build_encoder(key, **config), key=jr.fold_in(key, 1))
        counts = parameter_counts(mlm.encoder)
        print(
            f"\n--- {name}: inner width {config['inner_dim']}, {counts['params']:,} "
            f"encoder parameters ({counts['params_non_embedding']:,} non-embedding)",
            flush=True,
        )
        start = timer()
        pre = pretrain_mlm(
            mlm,
            train_texts,
            eval_texts,
            tok,
            steps=cfg["steps"],
            batch_size=batch_size,
            length=length,
            lr=cfg["lr"],
            warmup=cfg["warmup"],
            seed=cfg["seed"],
            progress=False,
        )
        pretrain_s = timer() - start
        mlm_eval = _last(pre.history, "eval")
        if routing == "ssm":
            kernel_panels[name] = model_kernels(pre.model, length)
        start = timer()
        ft = finetune_classifier(
            Classifier(pre.model.encoder, num_classes, key=jr.fold_in(key, 2)),
            ft_train,
            ft_eval,
            tok,
            length=length,
            steps=cfg["finetune_steps"],
            batch_size=batch_size,
            lr=cfg["finetune_lr"],
            seed=cfg["seed"],
            progress=False,
        )
        finetune_s = timer() - start
        ft_eval_metrics = _last(ft.history, "eval")
        train_records = [r for r in pre.history if r.get("split") == "train"]
        results.append(
            dict(
                name=name,
                architecture=architecture,
                routing=routing,
                inner_dim=config["inner_dim"],
                **counts,
                tokens=cfg["steps"] * batch_size * length,
                mlm_loss=mlm_eval["loss"],
                mlm_accuracy=mlm_eval["accuracy"],
                finetune_loss=ft_eval_metrics["loss"],
                finetune_accuracy=ft_eval_metrics["accuracy"],
                pretrain_seconds=round(pretrain_s, 1),
                finetune_seconds=round(finetune_s, 1),
                pretrain_tokens_per_s=_steady_throughput(train_records),
                mlm_curve=[[r["step"], r["loss"]] for r in train_records],
            )
        )
        r = results[-1]
        print(
            f"{name}: held-out MLM loss {r['mlm_loss']:.3f} (acc. {r['mlm_accuracy']:.3f}), "
            f"fine-tune acc. {r['finetune_accuracy']:.3f}  "
            f"[{_fmt_seconds(pretrain_s)} + {_fmt_seconds(finetune_s)}, "
            f"{r['pretrain_tokens_per_s'] or float('nan'):,.0f} tokens/s]",
            flush=True,
        )
    # Context-free reference points.
    uni_loss, uni_acc = _unigram_reference(train_texts, eval_texts, tok, length, batch_size)
    train_labels = np.asarray([ft_train[i]["label"] for i in range(len(ft_train))])
    eval_labels = np.asarray([ft_eval[i]["label"] for i in range(len(ft_eval))])
    majority = float(np.mean(eval_labels == np.bincount(train_labels).argmax()))
    table = ablation_table(results)
    by = {(r["architecture"], r["routing"]): r for r in results}
    gap = by["gated", "ssm"]["finetune_accuracy"] - by["stack", "ssm"]["finetune_accuracy"]
    payload = {
        "description": "Small-scale Table 1 of Wang et al. (BiGS): four architecture/routing "
        "variants at matched non-embedding parameters and pretraining tokens.",
        "settings": {**cfg, "corpus": str(args.corpus or "stdlib"), "task": task_name},
        "baselines": {
            "unigram_mlm_loss": uni_loss,
            "unigram_mlm_accuracy": uni_acc,
            "finetune_majority_accuracy": majority,
        },
        "results": results,
        "gated_minus_stack_ssm_finetune_accuracy": gap,
        "table_markdown": table,
        "total_seconds": round(timer(), 1),
        "environment": _environment(),
    }
    out = pathlib.Path(args.out)
    suffix = "" if jax.default_backend() == "cpu" else f"_{jax.default_backend()}"
    suffix += "_quick" if args.quick else ""
    _save_json(payload, out / f"bigs_ablation{suffix}.json")
    plot_ablation(results, out / f"bigs_ablation{suffix}.png")
    (out / f"bigs_ablation{suffix}.md").write_text(
        f"{table}\n\nd={cfg['dim']}, {cfg['layers']} layers, length {length}, "
        f"{cfg['tokenizer']} tokens (vocabulary {tok.vocab_size}), {cfg['steps']} pretraining "
        f"steps x {batch_size} sequences (the same batches for every variant), "
        f"{cfg['finetune_steps']} fine-tuning steps; {payload['total_seconds'] / 60:.0f} min "
        f"on {_environment()['device']}. Held-out MLM loss in nats per masked token; "
        f"unigram baseline: loss {uni_loss:.3f}, accuracy {uni_acc:.3f}. "
        f"Fine-tuning task: {task_name}; majority class {majority:.3f}. "
        f"GATED/SSM - STACK/SSM fine-tune accuracy: {gap:+.3f}.\n"
    )
    if kernel_panels:
        plot_kernels(kernel_panels, out / f"bigs_kernels{suffix}.png")
    print("\n" + table)
    print(
        f"unigram MLM baseline: loss {uni_loss:.3f}, acc. {uni_acc:.3f}; fine-tune majority "
        f"class: {majority:.3f}\nGATED/SSM - STACK/SSM fine-tune accuracy: {gap:+.3f}\n"
        f"written to {out}/bigs_ablation{suffix}.json/png in {_fmt_seconds(timer())}"
    )
    return payload


def _steady_throughput(records: Sequence[dict[str, Any]]) -> float | None:
    """Median tokens/s over the logged windows after the first (which holds the compile)."""
    rates = [r["tokens_per_s"] for r in records[1:] if "tokens_per_s" in r]
    return float(np.median(rates)) if rates else None


def _unigram_reference(
    train_texts: Sequence[str],
    eval_texts: Sequence[str],
    tok: ls.Tokenizer,
    length: int,
    batch_size: int,
    *,
    eval_batches: int = 8,
) -> tuple[float, float]:
    """The unigram baseline on exactly the held-out MLM targets `pretrain_mlm` scores."""
    data = _mlm_data(
        eval_texts,
        tok,
        length=length,
        batch_size=batch_size,
        mask_rate=0.15,
        seed=0,
        train=False,
    )
    batches = [b for b, _ in zip(iter(data), range(eval_batches), strict=False)]
    targets = np.concatenate([b["labels"][b["labels"] >= 0] for b in batches])
    stream = np.concatenate([tok.encode(t) for t in train_texts])
    return unigram_baseline(stream, targets, tok.vocab_size)


def _environment() -> dict[str, Any]:
    import os
    import platform

    return {
        "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "python": platform.python_version(),
        "processor_count": os.cpu_count(),
    }


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


def _corpus_arguments(parser: argparse.ArgumentParser, *, tokenizer: str) -> None:
    g = parser.add_argument_group("corpus")
    g.add_argument(
        "--corpus",
        type=pathlib.Path,
        default=None,
        help="a text file or a directory of text files (default: the stdlib .py sources)",
    )
    g.add_argument("--max-files", type=int, default=400, help="use at most N files (400)")
    g.add_argument(
        "--tokenizer", choices=("bpe", "byte"), default=tokenizer, help=f"default {tokenizer}"
    )
    g.add_argument("--vocab-size", type=int, default=2048, help="BPE vocabulary (2048)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `bigs pretrain | finetune | ablation | kernels` on `parser`."""
    sub = parser.add_subparsers(dest="bigs_command", required=True, metavar="SUBCOMMAND")

    pre = sub.add_parser(
        "pretrain",
        help="masked-LM pretraining on a text corpus",
        description="Masked-LM pretraining (15%% masking, 80/10/10, no NSP).",
    )
    _corpus_arguments(pre, tokenizer="bpe")
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
    _corpus_arguments(abl, tokenizer="byte")
    abl.add_argument("--dim", type=int, default=64)
    abl.add_argument("--layers", type=int, default=4)
    abl.add_argument("--length", type=int, default=128)
    abl.add_argument("--batch-size", type=int, default=16)
    abl.add_argument("--steps", type=int, default=500, help="pretraining steps per model")
    abl.add_argument("--lr", type=float, default=1e-3)
    abl.add_argument("--warmup", type=float, default=0.05, help="warmup fraction (0.05)")
    abl.add_argument(
        "--finetune-task",
        choices=("listops", "continuation"),
        default="listops",
        help="ListOps (default) or the corpus continuation task (does B continue A?)",
    )
    abl.add_argument("--finetune-steps", type=int, default=300)
    abl.add_argument("--finetune-lr", type=float, default=1e-3)
    abl.add_argument("--finetune-examples", type=int, default=4000, help="training rows")
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
    """`make demo`: MLM-pretrain a tiny BiGS on the stdlib corpus and compare its
    held-out masked-token loss/accuracy with the unigram baseline; saves the curves and
    the Figure-3 kernel heat map under `out_dir`."""
    out_dir = pathlib.Path(out_dir)
    steps, length, files = (80, 64, 60) if small else (500, 128, 300)
    batch_size, seed = 16, 0
    train_texts, eval_texts = load_corpus(None, files)
    tok = ls.ByteTokenizer()
    key = jr.key(seed)
    encoder = build_encoder(key, vocab_size=tok.vocab_size, dim=64, num_layers=2)
    model = MaskedLM(encoder, key=jr.fold_in(key, 1))
    print(
        f"BiGS (GATED/SSM, d=64, 2 layers, {ls.count_parameters(model):,} parameters): "
        f"MLM on {len(train_texts)} stdlib files, bytes, "
        f"{steps} steps x {batch_size} x {length} tokens",
        flush=True,
    )
    result = pretrain_mlm(
        model,
        train_texts,
        eval_texts,
        tok,
        steps=steps,
        batch_size=batch_size,
        length=length,
        lr=2e-3,
        warmup=0.05,
        seed=seed,
        out_dir=out_dir,
        progress=False,
    )
    metrics = _last(result.history, "eval")
    uni_loss, uni_acc = _unigram_reference(train_texts, eval_texts, tok, length, batch_size)
    print(
        f"held-out masked tokens: loss {metrics['loss']:.3f} nats (unigram baseline "
        f"{uni_loss:.3f}), accuracy {metrics['accuracy']:.3f} (unigram {uni_acc:.3f})"
    )
    fwd, bwd = model_kernels(result.model, length)
    print(f"kernels: {plot_kernels({'BiGS demo': (fwd, bwd)}, out_dir / 'kernels.png')}")
