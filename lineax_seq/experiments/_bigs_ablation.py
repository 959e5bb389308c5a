"""The small-scale Table 1 of Wang et al. ("Pretraining Without Attention"): GATED/SSM,
STACK/SSM, GATED/ATT and STACK/ATT pretrained at matched parameters and tokens, then
fine-tuned on one task (`python -m lineax_seq bigs ablation`)."""

from __future__ import annotations

import argparse
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.random as jr
import numpy as np

import lineax_seq as ls

from ._bigs_kernels import model_kernels, plot_kernels
from ._bigs_train import (
    Classifier,
    MaskedLM,
    build_encoder,
    finetune_classifier,
    last_metrics,
    listops_records,
    load_corpus,
    make_tokenizer,
    matched_inner_dim,
    mlm_data,
    parameter_counts,
    pretrain_mlm,
    rows_dataset,
    save_json,
    scaled_init_std,
)
from ._cli import UsageError, corpus_errors, output_problem, results_dir, settings_tag

VARIANTS = (("gated", "ssm"), ("stack", "ssm"), ("gated", "attention"), ("stack", "attention"))
# `--variants` spells a variant as "architecture/routing".
VARIANT_CHOICES = tuple(f"{a}/{r}" for a, r in VARIANTS)
VARIANT_LABELS = {
    ("gated", "ssm"): "GATED / SSM (BiGS)",
    ("stack", "ssm"): "STACK / SSM",
    ("gated", "attention"): "GATED / ATT",
    ("stack", "attention"): "STACK / ATT (BERT)",
}
RESULTS_DIR = results_dir()


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


def match_rows(
    texts: Sequence[str],
    *,
    num_rows: int,
    chars: int,
    distractor: int,
    seed: int = 0,
) -> list[tuple[str, str, int]]:
    """A matching-over-a-distance task (the paper's Table 4 probe) built from a corpus.

    Each row is `(A, D + B, label)`: `A` is `chars` characters of one document, `D` a
    distractor of `0 .. distractor` characters (uniform) from a different document, and
    `B` either `A` again (label 1) or another `chars` characters of `A`'s own document
    that do not overlap `A` and differ from it (label 0). Both classes read as coherent
    text of the same document, so the label is decided only by comparing `B` with `A`
    across the distractor, at a distance that varies from row to row: what Wang et al.
    (section 7.2, Table 4) credit the gated architecture with. Labels alternate (an
    even `num_rows` is exactly balanced), and `A` is drawn alike for both labels: only
    segments that have such a negative are used.

    **Arguments:**

    - `texts`: the documents; segments are drawn from those with at least `2 * chars`
      characters (and at least one other document for distractors).
    - `num_rows`: how many rows to make.
    - `chars`: characters per segment.
    - `distractor`: the largest distractor, in characters (0: none).
    - `seed`: the row sampler's seed (same texts + same seed -> same rows).

    **Returns:**

    A list of `(text, text_pair, label)` triples, `label` in `{0, 1}`.
    """
    if chars < 1:
        raise ValueError(f"`chars` must be at least 1, got {chars}")
    if distractor < 0:
        raise ValueError(f"`distractor` must be non-negative, got {distractor}")
    if num_rows < 0:
        raise ValueError(f"`num_rows` must be non-negative, got {num_rows}")
    docs = [t for t in texts if len(t) >= 2 * chars and len(t) >= distractor]
    if len(docs) < 2:
        raise ValueError(
            f"need at least 2 documents with >= max(2 * chars, distractor) = "
            f"{max(2 * chars, distractor)} characters, got {len(docs)} of {len(texts)}"
        )
    rng = np.random.default_rng(seed)
    rows: list[tuple[str, str, int]] = []
    for _ in range(100 * num_rows + 1000):
        if len(rows) == num_rows:
            return rows
        d = int(rng.integers(len(docs)))
        doc = docs[d]
        start = int(rng.integers(len(doc) - chars + 1))
        a = doc[start : start + chars]
        # A candidate negative is drawn for every row, whatever its label, and A is
        # kept only if it has one: A's distribution is then the same in both classes
        # (no document or position that only positives come from). Its starts, which
        # do not overlap A: [0, start - chars] and [start + chars, len - chars].
        left = max(start - chars + 1, 0)
        right = max(len(doc) - chars + 1 - (start + chars), 0)
        if left + right == 0:
            continue
        s = int(rng.integers(left + right))
        s = s if s < left else start + chars + (s - left)
        negative = doc[s : s + chars]
        if negative == a:  # repeated text (e.g. runs of blank lines): no negative
            continue
        label = len(rows) % 2
        b = a if label else negative
        e = int(rng.integers(len(docs) - 1))
        e += e >= d
        n = int(rng.integers(distractor + 1))
        s = int(rng.integers(len(docs[e]) - n + 1))
        rows.append((a, docs[e][s : s + n] + b, label))
    if len(rows) == num_rows:
        return rows
    raise ValueError(
        f"made only {len(rows)} of {num_rows} rows: too few segments of {chars} "
        "characters have a non-overlapping, different segment in their own document "
        f"(documents shorter than 3 * chars = {3 * chars} or repeating themselves)"
    )


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


def majority_accuracy(train_labels: np.ndarray, eval_labels: np.ndarray) -> float:
    """Held-out accuracy of always answering the training labels' most common class
    (the fine-tuning task's context-free baseline; ties go to the smaller class)."""
    return float(np.mean(eval_labels == np.bincount(train_labels).argmax()))


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
    from matplotlib.figure import Figure

    fig = Figure(figsize=(14, 3.8))
    axes = fig.subplots(1, 3)
    names = [r["name"] for r in results]
    colors = [f"C{i}" for i in range(len(results))]
    for r, c in zip(results, colors, strict=True):
        curve = np.asarray(r.get("mlm_curve", []), dtype=float).reshape(-1, 2)
        if curve.size:
            axes[0].plot(curve[:, 0], curve[:, 1], color=c, label=r["name"])
    axes[0].set_xlabel("pretraining step")
    axes[0].set_ylabel("MLM train loss (mean per log interval)")
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
    return path


def _fmt_seconds(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


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
    ListOps, or a corpus pair task (continuation or match; train rows from pretraining
    documents, eval rows from held-out ones)."""
    if task == "listops":
        records = listops_records(num_train + num_eval, seed=seed, tok=tok, length=length)
        import grain

        train = grain.MapDataset.source(records[:num_train])
        return train, grain.MapDataset.source(records[num_train:]), 10, "ListOps (10 classes)"
    # The segments (and the distractor) fill at most ~90% of the sequence after
    # tokenisation.
    budget = 0.9 * (length - 3) * _chars_per_token(train_texts, tok)
    if task == "match":
        chars = max(4, int(budget / 3))
        rows = lambda texts, n, s: match_rows(
            texts, num_rows=n, chars=chars, distractor=chars, seed=s
        )
        name = f"match across a distractor (2 x {chars} + 0..{chars} characters, 2 classes)"
    else:
        chars = max(8, int(budget / 2))
        rows = lambda texts, n, s: continuation_rows(texts, num_rows=n, chars=chars, seed=s)
        name = f"corpus continuation (2 x {chars} characters, 2 classes)"
    train = rows(train_texts, num_train, seed + 1)
    held = rows(eval_texts, num_eval, seed + 2)
    return rows_dataset(train), rows_dataset(held), 2, name


# Pretraining and fine-tuning steps per variant by default (`bigs ablation --steps`,
# `--finetune-steps`).
DEFAULT_STEPS = 500
DEFAULT_FINETUNE_STEPS = 300
# The settings the ablation records and reads from the command line.
SETTINGS = (
    "dim",
    "layers",
    "init_std",
    "length",
    "batch_size",
    "steps",
    "lr",
    "ssm_lr",
    "weight_decay",
    "warmup",
    "schedule",
    "eval_every",
    "finetune_task",
    "finetune_steps",
    "finetune_lr",
    "finetune_examples",
    "seed",
    "max_files",
    "tokenizer",
    "vocab_size",
    "variants",
)
# `--quick`: a smoke run of the whole pipeline in about two minutes on a laptop CPU.
QUICK = dict(
    dim=32,
    layers=2,
    length=64,
    batch_size=8,
    steps=30,
    finetune_steps=20,
    finetune_examples=64,
    max_files=40,
    vocab_size=512,
)


def _run_variant(
    architecture: str,
    routing: str,
    cfg: dict[str, Any],
    *,
    base: dict[str, Any],
    target_params: int,
    corpus: tuple[Sequence[str], Sequence[str]],
    tok: ls.Tokenizer,
    task: tuple[Any, Any, int],
) -> tuple[dict[str, Any], MaskedLM]:
    """Pretrain one (architecture, routing) variant, then fine-tune it on `task`;
    returns its row of the results and the pretrained model."""
    name = VARIANT_LABELS[architecture, routing]
    length, batch_size = cfg["length"], cfg["batch_size"]
    config = dict(
        base,
        architecture=architecture,
        routing=routing,
        # Attention needs absolute positions (BERT's); the SSM kernels are positional.
        max_length=length if routing == "attention" else None,
    )
    config["inner_dim"] = matched_inner_dim(config, target_params)
    key = jr.key(cfg["seed"])
    mlm = MaskedLM(build_encoder(key, **config), key=jr.fold_in(key, 1))
    counts = parameter_counts(mlm.encoder)
    print(
        f"\n--- {name}: inner width {config['inner_dim']}, {counts['params']:,} "
        f"encoder parameters ({counts['params_non_embedding']:,} non-embedding)",
        flush=True,
    )
    start = time.perf_counter()
    pre = pretrain_mlm(
        mlm,
        *corpus,
        tok,
        steps=cfg["steps"],
        batch_size=batch_size,
        length=length,
        lr=cfg["lr"],
        ssm_lr=cfg["ssm_lr"],
        weight_decay=cfg["weight_decay"],
        warmup=cfg["warmup"],
        schedule=cfg["schedule"],
        eval_every=cfg["eval_every"],
        seed=cfg["seed"],
        progress=False,
    )
    pretrain_s = time.perf_counter() - start
    ft_train, ft_eval, num_classes = task
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
    finetune_s = time.perf_counter() - start - pretrain_s
    mlm_eval, ft_eval_metrics = last_metrics(pre.history, "eval"), last_metrics(ft.history, "eval")
    train_log = [r for r in pre.history if r.get("split") == "train"]
    row = dict(
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
        pretrain_tokens_per_s=_steady_throughput(train_log),
        mlm_curve=[[r["step"], r["loss"]] for r in train_log],
    )
    print(
        f"{name}: held-out MLM loss {row['mlm_loss']:.3f} (acc. {row['mlm_accuracy']:.3f}), "
        f"fine-tune acc. {row['finetune_accuracy']:.3f}  "
        f"[{_fmt_seconds(pretrain_s)} + {_fmt_seconds(finetune_s)}, "
        f"{row['pretrain_tokens_per_s'] or float('nan'):,.0f} tokens/s]",
        flush=True,
    )
    return row, pre.model


def ablation(args: argparse.Namespace) -> dict[str, Any]:
    """`bigs ablation`: the paper's Table 1 at small scale.

    The four (architecture, routing) variants are pretrained on the same batches with
    the same optimiser for the same number of tokens, at matched non-embedding
    parameter counts (same depth and width; each variant's inner width is solved for to
    match GATED/SSM with the paper's `3d`), then each is fine-tuned on the same task.
    `--variants` runs some of them (in the table's order). The results are written after
    every variant, with `"complete": false` and `_partial` before the file extensions
    until the last (then removed), so a run stopped early keeps the variants it
    finished and replaces no finished table. Writes `bigs_ablation.{json,png,md}` and
    `bigs_kernels.png` to `--out` (default: the source checkout's `benchmarks/results/`, else
    `./benchmarks/results/`; with the backend's name off CPU, the fine-tuning task's name
    for other than ListOps, `_<N>steps` for other than the default 500 pretraining steps,
    `_<N>ftsteps` for other than 300 fine-tuning steps, `_seed<N>` for a seed other than 0,
    `_quick` for `--quick`, then a short hash of any other setting that differs from the
    default run's: see `output_suffix`).
    """
    cfg = effective_settings(args)
    start = time.perf_counter()
    suffix = output_suffix(
        cfg, quick=args.quick, backend=jax.default_backend(), others=_other_settings(args)
    )
    out = pathlib.Path(args.out)
    for name in _OUTPUTS:  # before training: a name taken by a directory failed at the end
        stem, ext = name.split(".")
        for part in ("", "_partial"):
            problem = output_problem(
                "--out", out / f"bigs_{stem}{suffix}{part}.{ext}", directory=False
            )
            if problem is not None:
                raise UsageError(problem)
    length, batch_size = cfg["length"], cfg["batch_size"]
    num_eval = batch_size * max(1, cfg["finetune_examples"] // (4 * batch_size))
    with corpus_errors(args.corpus):  # the corpus and the tasks made of it, before training
        train_texts, eval_texts = load_corpus(args.corpus, cfg["max_files"], exclude=[out])
        tok = make_tokenizer(train_texts, cfg["tokenizer"], cfg["vocab_size"])
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
        # Context-free reference points, first: every write of the results carries them.
        uni_loss, uni_acc = unigram_reference(
            train_texts, eval_texts, tok, length, batch_size, seed=cfg["seed"]
        )
    base: dict[str, Any] = dict(
        vocab_size=tok.vocab_size,
        dim=cfg["dim"],
        num_layers=cfg["layers"],
        dropout=0.1,  # the paper's, for every variant
        init_std=cfg["init_std"],
    )
    abstract = eqx.filter_eval_shape(lambda: ls.BiGS(**base, key=jr.key(0)))
    target = parameter_counts(abstract)
    print(
        f"Table 1 ablation: d={cfg['dim']}, {cfg['layers']} layers, length {length}, "
        f"vocabulary {tok.vocab_size}, {cfg['steps']} x {batch_size} sequences of "
        f"pretraining; fine-tuning: {task_name}, {len(ft_train)} training / "
        f"{len(ft_eval)} held-out examples",
        flush=True,
    )
    train_labels = np.asarray([ft_train[i]["label"] for i in range(len(ft_train))])
    eval_labels = np.asarray([ft_eval[i]["label"] for i in range(len(ft_eval))])
    majority = majority_accuracy(train_labels, eval_labels)
    variants = [tuple(v.split("/")) for v in cfg["variants"]]
    results, kernel_panels = [], {}
    payload: dict[str, Any] = {}
    for architecture, routing in variants:
        row, model = _run_variant(
            architecture,
            routing,
            cfg,
            base=base,
            target_params=target["params_non_embedding"],
            corpus=(train_texts, eval_texts),
            tok=tok,
            task=(ft_train, ft_eval, num_classes),
        )
        results.append(row)
        if routing == "ssm":
            kernel_panels[row["name"]] = model_kernels(model, length)
        by = {(r["architecture"], r["routing"]): r for r in results}
        gap = None
        if ("gated", "ssm") in by and ("stack", "ssm") in by:
            gap = by["gated", "ssm"]["finetune_accuracy"] - by["stack", "ssm"]["finetune_accuracy"]
        payload = {
            "description": "Small-scale Table 1 of Wang et al. (BiGS): four architecture/routing "
            "variants at matched non-embedding parameters and pretraining tokens.",
            "settings": {
                **cfg,
                "corpus": str(args.corpus or "stdlib"),
                "task": task_name,
                # The SSMs' initial step sizes (the library's default, not an option).
                "ssm_dt_range": [abstract.dt_min, abstract.dt_max],
            },
            "complete": len(results) == len(variants),
            "baselines": {
                "unigram_mlm_loss": uni_loss,
                "unigram_mlm_accuracy": uni_acc,
                "finetune_majority_accuracy": majority,
            },
            "results": results,
            "gated_minus_stack_ssm_finetune_accuracy": gap,
            "table_markdown": ablation_table(results),
            "total_seconds": round(time.perf_counter() - start, 1),
            "environment": _environment(),
        }
        # After every variant, so that a run stopped early keeps the finished ones; under
        # `_partial` names until the last (a stopped run replaces no finished table).
        if payload["complete"]:
            _write_ablation(payload, kernel_panels, out, suffix)
            for name in _OUTPUTS:
                stem, ext = name.split(".")
                (out / f"bigs_{stem}{suffix}_partial.{ext}").unlink(missing_ok=True)
        else:
            _write_ablation(payload, kernel_panels, out, suffix + "_partial")
    return payload


# The files a run writes, as `bigs_<stem><suffix>[_partial].<ext>`.
_OUTPUTS = ("ablation.json", "ablation.png", "ablation.md", "kernels.png")

# The settings `output_suffix` spells out; `--quick` sets the others but seed, task.
_NAMED = ("finetune_task", "steps", "finetune_steps", "seed")


def effective_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings (`SETTINGS`): the command line's, `--quick`'s sizes (it caps
    `--max-files` and `--vocab-size`), and `--init-std`'s default for `--dim` resolved."""
    cfg = {k: getattr(args, k) for k in SETTINGS}
    if args.quick:
        cfg.update(QUICK, max_files=min(args.max_files, 40), vocab_size=min(args.vocab_size, 512))
    cfg["init_std"] = cfg["init_std"] or scaled_init_std(cfg["dim"])
    cfg["variants"] = [v for v in VARIANT_CHOICES if v in cfg["variants"]]
    return cfg


def _other_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings that differ from the default run's (the `--quick` one under
    `--quick`) and that the file names do not spell out, `--corpus` included. Compared
    as the run uses them, so a default given explicitly is no difference."""
    from ._bigs import add_arguments  # the parser's defaults (imports this module)

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    defaults = parser.parse_args(["ablation", *(["--quick"] if args.quick else [])])
    cfg, default = effective_settings(args), effective_settings(defaults)
    others = {k: cfg[k] for k in SETTINGS if k not in _NAMED and cfg[k] != default[k]}
    if args.corpus is not None:
        others["corpus"] = args.corpus
    return others


def output_suffix(
    cfg: dict[str, Any], *, quick: bool, backend: str, others: dict[str, Any] | None = None
) -> str:
    """What the ablation's file names carry after `bigs_ablation`, so that runs with other
    settings do not overwrite the default run's results: the backend off CPU, `_quick`,
    the fine-tuning task, `_<N>steps`, `_<N>ftsteps`, `_seed<N>` where they differ from
    the default run's, then a short hash of `others` (the other settings that differ)."""
    suffix = "" if backend == "cpu" else f"_{backend}"
    if quick:
        suffix += "_quick"
    suffix += f"_{cfg['finetune_task']}" if cfg["finetune_task"] != "listops" else ""
    if not quick:  # --quick sets the steps
        suffix += f"_{cfg['steps']}steps" if cfg["steps"] != DEFAULT_STEPS else ""
        ft = cfg["finetune_steps"]
        suffix += f"_{ft}ftsteps" if ft != DEFAULT_FINETUNE_STEPS else ""
    suffix += f"_seed{cfg['seed']}" if cfg["seed"] else ""
    return suffix + (f"_{settings_tag(others)}" if others else "")


def _write_ablation(
    payload: dict[str, Any],
    kernel_panels: dict[str, tuple[np.ndarray, np.ndarray]],
    out: pathlib.Path,
    suffix: str,
) -> None:
    """Write the ablation's JSON, figure, Markdown table and kernel heat map; print them."""
    cfg, base = payload["settings"], payload["baselines"]
    table = payload["table_markdown"]
    save_json(payload, out / f"bigs_ablation{suffix}.json")
    plot_ablation(payload["results"], out / f"bigs_ablation{suffix}.png")
    gap = payload["gated_minus_stack_ssm_finetune_accuracy"]
    summary = (
        f"Unigram MLM baseline: loss {base['unigram_mlm_loss']:.3f}, accuracy "
        f"{base['unigram_mlm_accuracy']:.3f}. Fine-tuning task: {cfg['task']}; majority class "
        f"{base['finetune_majority_accuracy']:.3f}."
    )
    if gap is not None:
        summary += f" GATED/SSM - STACK/SSM fine-tune accuracy: {gap:+.3f}."
    if not payload["complete"]:
        done, total = len(payload["results"]), len(cfg["variants"])
        summary += f" Partial: {done} of {total} variants so far."
    (out / f"bigs_ablation{suffix}.md").write_text(
        f"{table}\n\nd={cfg['dim']}, {cfg['layers']} layers, length {cfg['length']}, "
        f"initial weights' std {cfg['init_std']:.3g}, "
        f"SSM steps initialised in [{cfg['ssm_dt_range'][0]:g}, {cfg['ssm_dt_range'][1]:g}], "
        f"{cfg['tokenizer']} tokens, {cfg['steps']} pretraining steps x {cfg['batch_size']} "
        f"sequences (the same batches for every variant), {cfg['finetune_steps']} fine-tuning "
        f"steps; {payload['total_seconds'] / 60:.0f} min on "
        f"{payload['environment']['device']}. Held-out MLM loss in nats per masked token. "
        f"{summary}\n"
    )
    if kernel_panels:
        plot_kernels(kernel_panels, out / f"bigs_kernels{suffix}.png")
    print(f"\n{table}\n{summary}")
    print(f"written to {out}/bigs_ablation{suffix}.json/png/md in {payload['total_seconds']} s")


def _steady_throughput(records: Sequence[dict[str, Any]]) -> float | None:
    """Median tokens/s over the logged windows after the first (which holds the compile)."""
    rates = [r["tokens_per_s"] for r in records[1:] if "tokens_per_s" in r]
    return float(np.median(rates)) if rates else None


def unigram_reference(
    train_texts: Sequence[str],
    eval_texts: Sequence[str],
    tok: ls.Tokenizer,
    length: int,
    batch_size: int,
    *,
    seed: int,
    mask_rate: float = 0.15,
    eval_batches: int = 8,
) -> tuple[float, float]:
    """The unigram baseline on the held-out MLM targets `pretrain_mlm` scores with the
    same `seed`, `mask_rate` and `eval_batches` (the held-out masks depend on all three)."""
    data = mlm_data(
        eval_texts,
        tok,
        length=length,
        batch_size=batch_size,
        mask_rate=mask_rate,
        seed=seed,
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
