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

import numpy as np

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


def _pending(args: argparse.Namespace) -> None:
    raise NotImplementedError(f"`bigs {args.bigs_command}` lands with the BiGS models")


pretrain = finetune = ablation = kernels = _pending


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
