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
import functools
import json
import os
import pathlib
import shutil
from typing import Any

import jax.random as jr

import lineax_seq as ls

from ..data._classification import MIN_LENGTH as _MIN_LENGTH
from ..data._classification import MIN_PAIR_LENGTH as _PAIR_MIN_LENGTH
from ..training._checkpoint import CHECKPOINT_DIR
from ..training._train import METRICS_FILE
from ._bigs_ablation import (
    DEFAULT_FINETUNE_STEPS,
    DEFAULT_STEPS,
    RESULTS_DIR,
    VARIANT_CHOICES,
    ablation,
    unigram_reference,
)
from ._bigs_kernels import KERNEL_RADIUS, model_kernels, plot_kernels, png_path
from ._bigs_train import (
    CONFIG_FILE,
    FINAL_DIR,
    FINETUNE_FILE,
    RESULT_FILE,
    Classifier,
    MaskedLM,
    build_encoder,
    finetune_classifier,
    last_metrics,
    listops_records,
    load_corpus,
    load_pretrained,
    load_tokenizer,
    make_tokenizer,
    mlm_batches,
    parameter_counts,
    pretrain_mlm,
    print_metrics,
    read_rows,
    save_json,
    save_tokenizer,
    scaled_init_std,
    split_records,
    ssm_learning_rate,
)
from ._cli import (
    HelpFormatter,
    UsageError,
    corpus_errors,
    dropout_rate,
    existing_path,
    fraction,
    int_at_least,
    non_negative_float,
    non_negative_int,
    output_problem,
    path,
    positive_float,
    positive_fraction,
    positive_int,
    random_seed,
    reading_inputs,
)

# ---------------------------------------------------------------------------------------
# Checks of option combinations and of the run directories, before any data is loaded
# (`run` reports them as usage errors, the subcommands as `ValueError`s)
# ---------------------------------------------------------------------------------------


def _mlm_length_problem(args: argparse.Namespace) -> str | None:
    if args.length < _MIN_LENGTH:
        return (
            f"--length {args.length}: masked-LM sequences need at least {_MIN_LENGTH} tokens "
            "(<cls>, text, <sep>)"
        )
    return None


def _started(run_dir: pathlib.Path) -> bool:
    """Whether the run in `run_dir` has trained: it has a checkpoint or its final model
    (a `config.json` alone is a run that failed or stopped before its first checkpoint)."""
    return bool(ls.list_checkpoints(run_dir / CHECKPOINT_DIR)) or (run_dir / FINAL_DIR).exists()


def _run_problem(flag: str, run_dir: pathlib.Path) -> str | None:
    if not run_dir.is_dir():
        state = "is not a directory" if run_dir.exists() else "does not exist"
        return f"{flag} {run_dir}: {state} (a `bigs pretrain` output directory)"
    if not (run_dir / CONFIG_FILE).is_file():
        return f"{flag} {run_dir}: not a `bigs pretrain` output (no {CONFIG_FILE})"
    if not ls.list_checkpoints(run_dir / FINAL_DIR):
        return (
            f"{flag} {run_dir}: the run has not finished (no final model in "
            f"{run_dir / FINAL_DIR}); continue it with `bigs pretrain --resume --out {run_dir}`"
        )
    return None


def _model_problem(args: argparse.Namespace) -> str | None:
    """What in the model options the encoder cannot be built with, named by option."""
    if args.routing == "attention" and args.dim % args.heads:
        return f"--heads {args.heads}: must divide --dim {args.dim} (attention routing)"
    if args.routing == "ssm" and args.state_size % 2:
        return f"--state-size {args.state_size}: must be even (N / 2 complex conjugate pairs)"
    return None


def _pretrain_problem(args: argparse.Namespace) -> str | None:
    out: pathlib.Path = args.out
    if args.resume and not (out / CONFIG_FILE).exists():
        return f"--resume: {out} holds no run to resume (no {CONFIG_FILE})"
    if not args.resume:
        # Checked before anything is written: an existing run stays resumable, and
        # another command's files (a fine-tuning run, say) are never overwritten.
        if (out / CONFIG_FILE).exists():
            if _started(out):
                return f"{out} already holds a run: pass --resume to continue it, or a new --out"
            return (
                f"{out} holds a run that stopped before its first checkpoint: pass --resume "
                "to start it again with its recorded settings, or a new --out"
            )
        found = [
            n for n in (CHECKPOINT_DIR, FINAL_DIR, METRICS_FILE, RESULT_FILE) if (out / n).exists()
        ]
        if found:
            return f"--out {out} holds another run's files ({', '.join(found)}): choose a new --out"
    if args.init_from is not None and (problem := _run_problem("--init-from", args.init_from)):
        return problem
    if args.resume or args.init_from is not None:  # the checkpoint's model is used
        return _mlm_length_problem(args) or output_problem("--out", out)
    return _model_problem(args) or _mlm_length_problem(args) or output_problem("--out", out)


def _finetune_problem(args: argparse.Namespace) -> str | None:
    given_options = getattr(args, _GIVEN, ())
    if args.task == "file" and args.train is None:
        return "--task file needs --train PATH (a CSV or JSONL file)"
    if args.task == "file" and "listops_examples" in given_options:
        return "--task file: --listops-examples applies to --task listops only"
    if args.task == "listops":
        given = [f for f, v in (("--train", args.train), ("--eval", args.eval)) if v is not None]
        given += ["--regression"] if args.regression else []
        # (ListOps records that do not fit --length are left out, never cut.)
        given += ["--truncation"] if "truncation" in given_options else []
        if given:
            verb = "apply" if given[1:] else "applies"
            return f"--task listops: {' and '.join(given)} {verb} to --task file only"
    if args.length < _MIN_LENGTH:
        return (
            f"--length {args.length}: an example needs at least {_MIN_LENGTH} "
            f"tokens (<cls>, text, <sep>; a sentence pair {_PAIR_MIN_LENGTH})"
        )
    if (args.out / CONFIG_FILE).exists():  # its final/ would be replaced by the classifier
        return f"--out {args.out}: holds a `bigs pretrain` run; choose another directory"
    if (args.out / RESULT_FILE).exists():
        return f"--out {args.out}: holds a finished fine-tuning run; choose another directory"
    # A stopped run with checkpoints is resumed by its own command (one stopped before
    # its first checkpoint starts afresh, whatever the options).
    if (args.out / FINETUNE_FILE).exists() and ls.list_checkpoints(args.out / CHECKPOINT_DIR):
        with reading_inputs(f"--out {args.out}: {FINETUNE_FILE}"):
            recorded = json.loads((args.out / FINETUNE_FILE).read_text())
        settings = _finetune_settings(args)
        changed = [
            f"--{k.replace('_', '-')} {v} (recorded: {recorded.get(k)})"
            for k, v in settings.items()
            if recorded.get(k) != v
        ]
        if changed:
            return (
                f"--out {args.out}: holds an unfinished fine-tuning run with other options "
                f"({', '.join(changed)}); rerun its command to resume it, or choose another "
                "directory"
            )
    return _run_problem("--checkpoint", args.checkpoint) or output_problem("--out", args.out)


def _finetune_settings(args: argparse.Namespace) -> dict[str, Any]:
    """A fine-tuning run's options as its `finetune.json` records them: every option but
    `--out`, paths made absolute, in JSON's types (a rerun compares them)."""
    settings = {
        k: os.path.abspath(v) if isinstance(v, pathlib.Path) else v
        for k, v in vars(args).items()
        if k not in ("out", "command", _GIVEN)  # `command`: `python -m lineax_seq`'s
    }
    return json.loads(json.dumps(settings))


def _kernels_problem(args: argparse.Namespace) -> str | None:
    runs = [d.resolve() for d in args.checkpoint]
    if len(set(runs)) < len(runs):
        again = next(d for i, d in enumerate(args.checkpoint) if runs[i] in runs[:i])
        return f"--checkpoint {again}: given twice (one panel per run)"
    problems = (_run_problem("--checkpoint", d) for d in args.checkpoint)
    out = args.out / "kernels.png" if args.out.is_dir() else png_path(args.out)  # as `kernels`
    return next(filter(None, problems), None) or output_problem("--out", out, directory=False)


def _ablation_problem(args: argparse.Namespace) -> str | None:
    return _mlm_length_problem(args) or output_problem("--out", args.out)


_PROBLEMS = {
    "pretrain": _pretrain_problem,
    "finetune": _finetune_problem,
    "ablation": _ablation_problem,
    "kernels": _kernels_problem,
}


_SUBPARSERS: dict[str, argparse.ArgumentParser] = {}  # filled by `add_arguments`


def _check(args: argparse.Namespace) -> None:
    problem = _PROBLEMS[args.bigs_command](args)
    if problem is not None:
        raise UsageError(problem)


# ---------------------------------------------------------------------------------------
# Subcommands
# ---------------------------------------------------------------------------------------


BERT_POSITIONS = 512
"""Absolute positions an attention-routing model of `pretrain` learns at least: BERT's,
so that one pretrained at 128 tokens continues at 512 (`--init-from`)."""

# The options that make the model (and its tokenizer): a run continued from a checkpoint
# (`--resume`, `--init-from`) has the checkpoint's, recorded in its config.
_MODEL_OPTIONS = (
    "tokenizer",
    "vocab_size",
    "architecture",
    "routing",
    "dim",
    "layers",
    "init_std",
    "inner",
    "heads",
    "state_size",
    "dropout",
)


def _length_problem(model: MaskedLM, length: int, source: str) -> str | None:
    """Why `model` cannot read sequences of `length` tokens (attention's absolute
    positions end at its `max_length`; the SSM kernels are made for any length)."""
    max_length = model.encoder.max_length
    if model.encoder.routing == "attention" and max_length is not None and length > max_length:
        return (
            f"--length {length}: {source} has attention routing with absolute positions "
            f"up to {max_length}; use --length {max_length} or less"
        )
    return None


def _pretrain_inputs(args: argparse.Namespace) -> tuple[dict, MaskedLM, ls.Tokenizer, tuple]:
    """Read and check everything `pretrain` needs before it writes anything: the corpus,
    the tokenizer and model (new, the run's to resume, or `--init-from`'s) and the
    batches; returns `(config, model, tokenizer, (texts, batches))`.

    A `--resume` of a run with no checkpoint yet is the same run as a fresh start: the
    same keys, and the recorded `--init-from` weights re-applied.
    """
    out: pathlib.Path = args.out
    with corpus_errors(args.corpus):
        texts = load_corpus(args.corpus, args.max_files, exclude=[out])
    key = jr.key(args.seed)
    recorded = _recorded_config(out) if args.resume else {}
    start_from = args.init_from
    if args.resume and not _started(out) and recorded.get("init_from") is not None:
        start_from = pathlib.Path(recorded["init_from"])
        if problem := _run_problem("--resume: the run's --init-from", start_from):
            raise UsageError(problem)
    if start_from is not None:
        with reading_inputs(f"--init-from {start_from}"):
            model, tok, config = load_pretrained(start_from)
        # The source's model and tokenizer, not its history (`resumed`).
        source = {k: v for k, v in config.items() if k != "resumed"}
        config = recorded or {**source, "init_from": os.path.abspath(start_from)}
    elif args.resume:
        config = recorded
        with reading_inputs(f"--resume {out}"):
            tok = load_tokenizer(out, config["tokenizer"])
            model = MaskedLM(build_encoder(key, **config["model"]), key=jr.fold_in(key, 1))
    else:
        with corpus_errors(args.corpus):
            tok = make_tokenizer(texts[0], args.tokenizer, args.vocab_size)
        encoder = build_encoder(  # its options were checked by `_model_problem`
            key,
            vocab_size=tok.vocab_size,
            dim=args.dim,
            num_layers=args.layers,
            architecture=args.architecture,
            routing=args.routing,
            inner_dim=args.inner,
            num_heads=args.heads if args.routing == "attention" else None,
            max_length=max(args.length, BERT_POSITIONS) if args.routing == "attention" else None,
            state_size=args.state_size,
            dropout=args.dropout,
            init_std=args.init_std or scaled_init_std(args.dim),
        )
        model = MaskedLM(encoder, key=jr.fold_in(key, 1))
        config = {"model": encoder.config()}
        if args.tokenizer == "bpe" and tok.vocab_size < args.vocab_size:
            print(
                f"note: --vocab-size {args.vocab_size}: the corpus gives only "
                f"{tok.vocab_size} tokens (every pair that occurs twice is merged)",
                flush=True,
            )
    source = f"--init-from {start_from}" if start_from is not None else f"the run in {out}"
    if problem := _length_problem(model, args.length, source):
        raise UsageError(problem)
    with corpus_errors(args.corpus):
        batches = mlm_batches(
            *texts,
            tok,
            length=args.length,
            batch_size=args.batch_size,
            mask_rate=args.mask_rate,
            seed=args.seed,
            pack=args.pack,
        )
    return config, model, tok, (texts, batches)


def _recorded_config(out: pathlib.Path) -> dict[str, Any]:
    """The `config.json` of the run to resume, with the entries a resume needs."""
    with reading_inputs(f"--resume {out}: {CONFIG_FILE}"):
        config = json.loads((out / CONFIG_FILE).read_text())
    if not isinstance(config, dict) or not {"model", "tokenizer"} <= config.keys():
        raise UsageError(
            f"--resume {out}: {CONFIG_FILE} is not a `bigs pretrain` record (no model and "
            "tokenizer entries); start a new run with another --out"
        )
    return config


# The options of a pretraining run's data and optimiser: a `--resume` takes the recorded
# ones (its run's latest) wherever the command line leaves them out.
_RESUMED_OPTIONS = (
    "corpus",
    "max_files",
    "steps",
    "batch_size",
    "length",
    "lr",
    "ssm_lr",
    "weight_decay",
    "warmup",
    "schedule",
    "seed",
    "eval_every",
    "mask_rate",
    "pack",
)
# What runs recorded before an option existed used (their configs lack it).
_RECORDED_BEFORE = {"pack": False}


def _resume_options(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with the run's recorded data and optimiser options (those of its latest
    start or resume) in place of those not given, so that a bare `--resume --out DIR`
    continues the run as it was started. Options given (at their defaults too) override
    the record; a note names those that change it."""
    recorded = {**_RECORDED_BEFORE, **_latest_settings(_recorded_config(args.out))}
    args, _, changed = _with_recorded(args, recorded, _RESUMED_OPTIONS)
    if changed:
        print(f"note: --resume with changed options: {', '.join(changed)}", flush=True)
    return args


def _latest_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The options of a run's latest start or resume, as its `config.json` records them."""
    return (config.get("resumed") or [config.get("pretrain") or {}])[-1]


def _init_from_corpus(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with `--init-from`'s recorded corpus (`corpus`, `max_files`, `pack`) where
    the command line leaves them out, so that continuing a run at a longer length reads
    the text it was pretrained on, cut as it was (the default corpus would be another
    one); a note says so."""
    with reading_inputs(f"--init-from {args.init_from}: {CONFIG_FILE}"):
        recorded = _latest_settings(json.loads((args.init_from / CONFIG_FILE).read_text()))
    args, taken, _ = _with_recorded(args, recorded, ("corpus", "max_files", "pack"))
    if taken:
        print(
            f"note: --init-from {args.init_from}: pretraining on its corpus "
            f"({', '.join(taken)}); pass --corpus to choose another",
            flush=True,
        )
    return args


def _with_recorded(
    args: argparse.Namespace, recorded: dict[str, Any], names: tuple[str, ...]
) -> tuple[argparse.Namespace, list[str], list[str]]:
    """`args` with `recorded`'s values of the options `names` that the command line left
    out; also those taken (where they differ) and those given that differ from the
    record, as `--option value` notes."""
    merged, taken, changed = vars(args).copy(), [], []
    for name in names:
        if name not in recorded:
            continue
        value = recorded[name]
        if name == "corpus" and value is not None:
            value = pathlib.Path(value)
        flag = name.replace("_", "-")
        option = lambda v, flag=flag: (  # as the command line spells it
            f"--{'' if v else 'no-'}{flag}" if isinstance(v, bool) else f"--{flag} {v}"
        )
        if name not in merged.get(_GIVEN, ()):
            if merged[name] != value:
                taken.append(option(value))
            merged[name] = value
        elif _same_option(merged[name]) != _same_option(value):
            was = option(value) if isinstance(value, bool) else value
            changed.append(f"{option(merged[name])} (recorded: {was})")
    return argparse.Namespace(**merged), taken, changed


def _same_option(value: Any) -> Any:
    """`value` as `_settings` records it: a path absolute, so that a relative path given
    again (from anywhere) compares equal to the recorded one."""
    return os.path.abspath(value) if isinstance(value, pathlib.Path) else value


def _settings(args: argparse.Namespace, *, from_checkpoint: bool) -> dict[str, Any]:
    """The options a run used, for its config: without the model's (and tokenizer's)
    when it continues a checkpoint, whose own are in the config. Paths are made
    absolute, so that a `--resume` from another directory reads the same corpus."""
    skip = (*_MODEL_OPTIONS, _GIVEN) if from_checkpoint else (_GIVEN,)
    return {k: _same_option(v) for k, v in vars(args).items() if k not in skip}


def pretrain(args: argparse.Namespace) -> dict[str, Any]:
    """`bigs pretrain`: MLM pretraining; writes config, tokenizer, checkpoints, metrics,
    curves, the final model and (SSM routing) the kernel heat map into `--out`.

    Nothing is written before the corpus, the model and the batches are built (see
    `_pretrain_inputs`). `config.json` records the model trained and, under `pretrain`,
    the options of the run that started it (no model options when it started from
    `--init-from`'s checkpoint); every `--resume` appends its options to `resumed`.
    """
    out: pathlib.Path = args.out
    _check(args)  # before anything is read or written
    given = getattr(args, _GIVEN, ())
    ignored = [f"--{k.replace('_', '-')}" for k in _MODEL_OPTIONS if k in given]
    if ignored and (args.resume or args.init_from is not None):
        flag = "--resume" if args.resume else "--init-from"
        print(
            f"note: {flag} uses the checkpoint's model; ignored: {', '.join(ignored)}", flush=True
        )
    if args.resume:
        args = _resume_options(args)
        _check(args)
    elif args.init_from is not None:
        args = _init_from_corpus(args)
    config, model, tok, ((train_texts, eval_texts), batches) = _pretrain_inputs(args)
    out.mkdir(parents=True, exist_ok=True)
    config["tokenizer"] = save_tokenizer(tok, out)
    from_checkpoint = args.resume or args.init_from is not None
    settings = _settings(args, from_checkpoint=from_checkpoint)
    if args.resume:
        config["resumed"] = [*config.get("resumed", []), settings]
    else:
        config["pretrain"] = settings
    save_json(config, out / CONFIG_FILE)
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
        **_optim_options(args),
        mask_rate=args.mask_rate,
        pack=args.pack,
        out_dir=out,
        checkpoint_every=max(1, args.steps // 4),
        # --resume continues from the checkpoint if there is one (a run that never
        # reached one starts at step 0); a new run refuses a directory with another's.
        resume=args.resume,
        data=batches,
    )
    ls.save_checkpoint(
        out / FINAL_DIR, result.step, model=result.model, key=jr.key(args.seed), keep=1
    )
    metrics = last_metrics(result.history, "eval")
    print_metrics("held-out MLM", metrics)
    if result.model.encoder.routing == "ssm":
        fwd, bwd = model_kernels(result.model, max(args.length, 2 * KERNEL_RADIUS + 1))
        print(f"kernels: {plot_kernels({'pretrained': (fwd, bwd)}, out / 'kernels.png')}")
    print(f"model, checkpoints and metrics in {out}/")
    return metrics


def _finetune_inputs(args: argparse.Namespace) -> tuple[MaskedLM, ls.Tokenizer, tuple]:
    """Read and check what `finetune` needs: the checkpoint, and the task's records
    (the data files' problems named by their option); returns `(mlm, tokenizer,
    (train records, eval records, outputs, class names))`."""
    with reading_inputs(f"--checkpoint {args.checkpoint}"):
        mlm, tok, _ = load_pretrained(args.checkpoint)
    if problem := _length_problem(mlm, args.length, f"--checkpoint {args.checkpoint}"):
        raise UsageError(problem)
    if args.task == "listops":
        with reading_inputs(f"--length {args.length}"):
            records = listops_records(
                args.listops_examples, seed=args.seed, tok=tok, length=args.length
            )
        train_records, eval_records = split_records(records)
        num_outputs, names = 10, None
    else:
        with reading_inputs(f"--train {args.train}"):
            train_records, num_outputs, names = read_rows(args.train, regression=args.regression)
        if names is None and not args.regression:
            _note_unused_classes(args.train, train_records, num_outputs)
        if args.eval is not None:
            with reading_inputs(f"--eval {args.eval}"):
                class_ids = names is None and not args.regression
                eval_records, _, _ = read_rows(
                    args.eval,
                    regression=args.regression,
                    label_names=names,
                    num_classes=num_outputs if class_ids else None,
                )
            pairs = ("text_pair" in train_records[0], "text_pair" in eval_records[0])
            if pairs[0] != pairs[1]:
                form = lambda pair: "sentence pairs" if pair else "single texts"
                raise UsageError(
                    f"--eval {args.eval} has {form(pairs[1])} but --train {args.train} has "
                    f"{form(pairs[0])}: both files need the same form"
                )
        else:
            train_records, eval_records = split_records(train_records)
        if "text_pair" in train_records[0] and args.length < _PAIR_MIN_LENGTH:
            raise UsageError(
                f"--length {args.length}: --train {args.train} has sentence pairs, which "
                f"need at least {_PAIR_MIN_LENGTH} tokens (<cls>, text, <sep>, text, <sep>)"
            )
        if "text_pair" in train_records[0] and not mlm.encoder.num_token_types:
            print(
                f"note: --train {args.train} has sentence pairs, and the encoder has no "
                "token-type (segment) embeddings (bigs pretrain builds none): <sep> alone "
                "tells the two texts apart",
                flush=True,
            )
    where = "--listops-examples" if args.task == "listops" else "--train"
    if len(train_records) < args.batch_size:
        raise UsageError(
            f"--batch-size {args.batch_size}: {where} gives only {len(train_records)} "
            "training examples; use a smaller --batch-size or more examples"
        )
    if not len(eval_records):
        raise UsageError(
            f"{where} {args.listops_examples if args.task == 'listops' else args.train}: its "
            f"{len(train_records)} example(s) leave none held out (every 10th is); give "
            "more examples" + ("" if args.task == "listops" else ", or a held-out file (--eval)")
        )
    return mlm, tok, (train_records, eval_records, num_outputs, names)


def _note_unused_classes(path: pathlib.Path, records: Any, num_classes: int) -> None:
    """Print a note naming the class ids in `0 .. num_classes - 1` that no record has
    (labels counted from 1, say): their outputs are never trained."""
    seen = {records[i]["label"] for i in range(len(records))}
    unused = [c for c in range(num_classes) if c not in seen]
    if unused:
        print(
            f"note: --train {path}: class id(s) {unused} never occur among the labels 0 .. "
            f"{num_classes - 1}; their outputs are never trained (number classes from 0)",
            flush=True,
        )


def finetune(args: argparse.Namespace) -> dict[str, Any]:
    """`bigs finetune`: classification/regression from a `bigs pretrain` run."""
    _check(args)
    mlm, tok, (train_records, eval_records, num_outputs, names) = _finetune_inputs(args)
    model = Classifier(mlm.encoder, num_outputs, key=jr.key(args.seed + 1))
    kind = "regression" if num_outputs == 1 else f"{num_outputs} classes"
    kind += f": {', '.join(names)}" if names else ""
    print(
        f"fine-tuning {args.checkpoint} ({args.task}, {kind}): {len(train_records)} "
        f"training / {len(eval_records)} held-out examples, length {args.length}",
        flush=True,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    save_json(_finetune_settings(args), args.out / FINETUNE_FILE)
    try:  # a run killed here resumes from its checkpoints; another model's are refused
        result = finetune_classifier(
            model,
            train_records,
            eval_records,
            tok,
            **_optim_options(args),
            out_dir=args.out,
            checkpoint_every=max(1, args.steps // 4),
            truncation=args.truncation,
        )
    except ls.CheckpointError as e:
        raise UsageError(
            f"--out {args.out} holds checkpoints this fine-tuning run cannot resume ({e}); "
            "choose a new --out"
        ) from e
    if result.resumed_from is not None:
        print(f"resumed the unfinished run in {args.out} at step {result.resumed_from}")
    metrics = last_metrics(result.history, "eval")
    print_metrics("held-out", metrics)
    summary = {
        "checkpoint": os.path.abspath(args.checkpoint),
        "task": args.task,
        "train": None if args.train is None else os.path.abspath(args.train),
        "eval": None if args.eval is None else os.path.abspath(args.eval),
        "truncation": args.truncation,
        **_optim_options(args),
        "ssm_lr_used": ssm_learning_rate(lr=args.lr, ssm_lr=args.ssm_lr),
        "train_examples": len(train_records),
        "eval_examples": len(eval_records),
        **metrics,
    }
    if args.task == "listops":
        summary["listops_examples"] = args.listops_examples
    if names is not None:
        summary["label_names"] = list(names)  # class i is names[i]
    summary["num_outputs"] = num_outputs
    ls.save_checkpoint(
        args.out / FINAL_DIR, result.step, model=result.model, key=jr.key(args.seed), keep=1
    )
    save_json(summary, args.out / RESULT_FILE)
    # Only a stopped run resumes from its checkpoints (a finished one is refused).
    shutil.rmtree(args.out / CHECKPOINT_DIR, ignore_errors=True)
    print(f"fine-tuned model in {args.out / FINAL_DIR}, summary in {args.out / RESULT_FILE}")
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
    _check(args)
    panels = {}
    for run_dir in args.checkpoint:
        with reading_inputs(f"--checkpoint {run_dir}"):
            model, _, config = load_pretrained(run_dir)
        if model.encoder.routing != "ssm":
            print(f"skipping {run_dir}: routing={model.encoder.routing!r} has no kernels")
            continue
        length = max(128, 2 * args.radius + 1)
        arch = config["model"]["architecture"].upper()
        names = [d.name for d in args.checkpoint]
        name = run_dir.name if names.count(run_dir.name) == 1 else str(run_dir)
        panels[f"{name} ({arch}/SSM)"] = model_kernels(model, length)
    if not panels:
        raise UsageError(
            f"--checkpoint {' '.join(map(str, args.checkpoint))}: no run with SSM routing "
            "(attention has no kernels to draw)"
        )
    out = args.out / "kernels.png" if args.out.is_dir() else args.out
    path = plot_kernels(panels, out, radius=args.radius)
    print(f"kernel heat map: {path}")
    return path


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------


def _model_arguments(parser: argparse.ArgumentParser, *, layers: int, dim: int) -> None:
    g = parser.add_argument_group("model (ignored with --init-from/--resume: the checkpoint's)")
    add = functools.partial(g.add_argument, action=_Given)  # a note names those ignored
    add("--architecture", choices=("gated", "stack"), default="gated", help="GATED or STACK block")
    add(
        "--routing",
        choices=("ssm", "attention"),
        default="ssm",
        help="token mixing (attention learns max(--length, 512) absolute positions, as BERT)",
    )
    _size_arguments(add, layers=layers, dim=dim)
    add("--inner", type=positive_int, default=None, help="inner width (default 3d gated, 4d stack)")
    add("--heads", type=positive_int, default=4, help="attention heads (routing=attention)")
    add("--state-size", type=positive_int, default=64, help="SSM state size N")
    add("--dropout", type=dropout_rate, default=0.1, help="dropout rate")


def _size_arguments(add: Any, *, layers: int, dim: int) -> None:
    """`--dim`, `--layers`, `--init-std`, added by `add` (a group's `add_argument`)."""
    add("--dim", type=positive_int, default=dim, help="hidden size d")
    add("--layers", type=positive_int, default=layers, help="layers")
    add(
        "--init-std",
        type=positive_float,
        default=None,
        help="std of the initial weights (default 0.02 * sqrt(1024 / d): BERT's 0.02 at "
        "the paper's d = 1024, the same pre-activation scale at smaller d)",
    )


_GIVEN = "given_options"


class _Given(argparse.Action):
    """Store the value and note the option as given (in `args.given_options`), so that a
    `--resume` tells an option given at its default from one left out."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        _note_given(namespace, self.dest)


class _GivenSwitch(argparse.BooleanOptionalAction):
    """`--option` / `--no-option`, noted as given as `_Given` notes its options."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        _note_given(namespace, self.dest)


def _note_given(namespace: argparse.Namespace, dest: str) -> None:
    setattr(namespace, _GIVEN, getattr(namespace, _GIVEN, frozenset()) | {dest})


def _optim_arguments(
    parser: argparse.ArgumentParser,
    *,
    lr: float,
    steps: int,
    batch: int,
    length: int,
    warmup: float = 0.01,
    schedule: str = "cosine",
) -> None:
    g = parser.add_argument_group("optimisation (AdamW, beta2 0.98, eps 1e-6)")
    add = functools.partial(g.add_argument, action=_Given)
    add("--steps", type=positive_int, default=steps, help="optimiser steps")
    add("--batch-size", type=positive_int, default=batch, help="sequences per batch")
    add("--length", type=positive_int, default=length, help="sequence length")
    add("--lr", type=positive_float, default=lr, help="peak learning rate")
    add(
        "--ssm-lr",
        type=non_negative_float,
        default=1e-3,
        help="peak learning rate of the SSM parameter group (S4D kernels, no weight decay), "
        "capped at --lr (so with the default --lr the SSMs train at --lr); 0 means --lr",
    )
    add(
        "--weight-decay",
        type=non_negative_float,
        default=0.01,
        help="AdamW weight decay (not of biases and LayerNorm gains)",
    )
    add("--warmup", type=fraction, default=warmup, help="warmup fraction of the steps")
    add(
        "--schedule",
        choices=("cosine", "linear"),
        default=schedule,
        help="learning-rate decay after the warmup",
    )
    add("--seed", type=random_seed, default=0, help="seed of weights, data and masks")
    add("--eval-every", type=non_negative_int, default=0, help="evaluate every N steps (0: end)")


def _optim_options(args: argparse.Namespace) -> dict[str, Any]:
    """The `_optim_arguments` values, as `pretrain_mlm`/`finetune_classifier` take them."""
    names = (
        "steps", "batch_size", "length", "lr", "ssm_lr", "weight_decay", "warmup",
        "schedule", "eval_every", "seed",
    )  # fmt: skip
    return {k: getattr(args, k) for k in names}


_BYTE_VOCAB = ls.ByteTokenizer().vocab_size  # the least BPE vocabulary: specials + bytes


def _corpus_arguments(
    parser: argparse.ArgumentParser, *, tokenizer: str, from_checkpoint: bool = False
) -> None:
    g = parser.add_argument_group("corpus")
    add = functools.partial(g.add_argument, action=_Given)
    add(
        "--corpus",
        type=existing_path,
        default=None,
        help='a .txt / .py file, a .jsonl file (a document per line, its text in a "text" '
        "field) or a directory of such files, --out skipped (default: the stdlib .py "
        "sources)",
    )
    add(
        "--max-files",
        type=positive_int,
        default=400,
        help="train on at most N documents (files, or lines of a .jsonl), evenly spaced over "
        "the corpus; a note says when some are left out",
    )
    ignored = " (ignored with --init-from/--resume: the checkpoint's)" if from_checkpoint else ""
    add(
        "--tokenizer",
        choices=("bpe", "byte"),
        default=tokenizer,
        help=f"subword (BPE, trained on the corpus) or byte tokens{ignored}",
    )
    add(
        "--vocab-size",
        type=int_at_least(_BYTE_VOCAB, "7 special tokens + 256 bytes"),
        default=2048,
        help=f"BPE vocabulary, at least {_BYTE_VOCAB}; at most what the corpus "
        f"gives (a note says so){ignored}",
    )


def _path(parser: Any, flag: str, help: str, **kwargs: Any) -> None:
    parser.add_argument(flag, type=kwargs.pop("type", path), help=help, **kwargs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register `bigs pretrain | finetune | ablation | kernels` on `parser`."""
    sub = parser.add_subparsers(dest="bigs_command", required=True, metavar="SUBCOMMAND")

    pre = sub.add_parser(
        "pretrain",
        formatter_class=HelpFormatter,
        help="masked-LM pretraining on a text corpus",
        description="Masked-LM pretraining (15% masking, 80/10/10, no NSP).",
    )
    _corpus_arguments(pre, tokenizer="bpe", from_checkpoint=True)
    _model_arguments(pre, layers=4, dim=128)
    _optim_arguments(pre, lr=1e-3, steps=2000, batch=32, length=128)
    _path(
        pre,
        "--out",
        "run directory (default outputs/bigs/pretrain); a new run needs one without "
        "another run's files",
        default=pathlib.Path("outputs/bigs/pretrain"),
    )
    pre.add_argument(
        "--mask-rate",
        action=_Given,
        type=positive_fraction,
        default=0.15,
        help="fraction of the tokens masked, in (0, 1]",
    )
    pre.add_argument(
        "--pack",
        action=_GivenSwitch,
        default=False,
        help="join the documents, <sep> between them, before cutting sequences (RoBERTa's "
        "FULL-SENTENCES): for a corpus of short documents, e.g. a JSONL file of sentences, "
        "whose sequences would otherwise be mostly padding",
    )
    init = pre.add_mutually_exclusive_group()
    init.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its checkpoint, with its model, tokenizer and "
        "recorded data and optimiser options (options given here override those; a run with "
        "no checkpoint yet starts again, from its own --init-from if it had one)",
    )
    _path(
        init,
        "--init-from",
        "start from this run's weights, e.g. at a longer --length, on its corpus (its "
        "--corpus and --max-files where they are not given)",
    )

    fin = sub.add_parser(
        "finetune",
        formatter_class=HelpFormatter,
        help="classification/regression from a pretrained checkpoint",
        description="Fine-tune a pretrained BiGS on a (text, label) file or on ListOps.",
    )
    _path(fin, "--checkpoint", "a `bigs pretrain --out` directory", required=True)
    fin.add_argument(
        "--task",
        choices=("file", "listops"),
        default="file",
        help="a (text, label) file (--train) or generated ListOps",
    )
    _path(
        fin,
        "--train",
        "(text, label) CSV or JSONL file (optional text_pair column); labels are class "
        "ids 0, 1, ..., class names (numbered in sorted order; not mixed with ids), or reals "
        "with --regression",
        type=existing_path,
    )
    _path(fin, "--eval", "held-out file (default: every 10th row of --train)", type=existing_path)
    fin.add_argument(
        "--regression", action="store_true", help="real-valued labels (default: classes)"
    )
    fin.add_argument(
        "--truncation",
        action=_Given,
        choices=("longest_first", "end"),
        default="longest_first",
        help="how an example of --task file longer than --length is cut: keeping <cls> and "
        "every <sep> and shortening the longer text of a pair first (BERT's, the default), "
        "or cutting the encoded example at the end",
    )
    fin.add_argument(
        "--listops-examples",
        action=_Given,
        type=positive_int,
        default=4000,
        help="ListOps training rows (--task listops)",
    )
    _optim_arguments(fin, lr=3e-4, steps=500, batch=32, length=128, warmup=0.1, schedule="linear")
    _path(
        fin,
        "--out",
        "output directory (default outputs/bigs/finetune): the options (finetune.json), "
        "checkpoints, metrics, curves, result.json, kernels and the fine-tuned model in "
        "final/; the same command resumes a run that was stopped",
        default=pathlib.Path("outputs/bigs/finetune"),
    )

    abl = sub.add_parser(
        "ablation",
        formatter_class=HelpFormatter,
        help="the Table 1 ablation at small scale",
        description="GATED/SSM, STACK/SSM, GATED/ATT, STACK/ATT at matched parameters and "
        "tokens: held-out MLM loss and a fine-tuning accuracy. The defaults (d=64, 4 layers, "
        "L=128, 500 MLM + 300 ListOps steps per variant) take about 5 min on 2 CPU cores.",
    )
    _corpus_arguments(abl, tokenizer="byte")
    _size_arguments(abl.add_argument_group("model").add_argument, layers=4, dim=64)
    _optim_arguments(abl, lr=1e-3, steps=DEFAULT_STEPS, batch=16, length=128, warmup=0.05)
    abl.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANT_CHOICES,
        default=list(VARIANT_CHOICES),
        metavar="ARCH/ROUTE",
        help="the variants to run, in the table's order whatever the order given "
        f"(default all four: {' '.join(VARIANT_CHOICES)})",
    )
    g = abl.add_argument_group("fine-tuning")
    g.add_argument(
        "--finetune-task",
        choices=("listops", "continuation", "match"),
        default="listops",
        help="ListOps (default), or a corpus pair task: continuation (does B continue A?) "
        "or match (is B a copy of A, after a distractor of varying length?)",
    )
    g.add_argument(
        "--finetune-steps", type=positive_int, default=DEFAULT_FINETUNE_STEPS, help="train steps"
    )
    g.add_argument("--finetune-lr", type=positive_float, default=1e-3, help="peak learning rate")
    g.add_argument("--finetune-examples", type=positive_int, default=4000, help="training rows")
    abl.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: tiny sizes and budget (sets --dim, --layers, --length, "
        "--batch-size, --steps, --finetune-steps, --finetune-examples; caps --max-files "
        "at 40 and --vocab-size at 512)",
    )
    _path(
        abl,
        "--out",
        "where bigs_ablation*.json/png/md and bigs_kernels*.png go, with a suffix for "
        "settings other than the default run's (default: the checkout's "
        "benchmarks/results, else ./benchmarks/results)",
        default=RESULTS_DIR,
    )

    ker = sub.add_parser(
        "kernels",
        formatter_class=HelpFormatter,
        help="Figure 3: forward/backward kernel heat map of a checkpoint",
        description="Heat map of every layer's forward/backward SSM kernel over relative "
        "positions -radius..radius (min-max scaled |K| per layer).",
    )
    _path(ker, "--checkpoint", "`bigs pretrain --out` directories", required=True, nargs="+")
    ker.add_argument(
        "--radius",
        type=positive_int,
        default=KERNEL_RADIUS,
        help="largest |relative position| shown",
    )
    _path(
        ker,
        "--out",
        "the PNG to write (.png is appended to other names; an existing directory gets "
        "kernels.png; default outputs/bigs/kernels.png)",
        default=pathlib.Path("outputs/bigs/kernels.png"),
    )
    _SUBPARSERS.update(pretrain=pre, finetune=fin, ablation=abl, kernels=ker)


def run(args: argparse.Namespace) -> int:
    """Dispatch `python -m lineax_seq bigs <subcommand>`, after the checks that need
    several options or the run directories (a usage error, before any data is loaded);
    an input the subcommand cannot use (`UsageError`, found before training) is the
    subcommand's usage error too."""
    parser = _SUBPARSERS[args.bigs_command]
    commands = {
        "pretrain": pretrain,
        "finetune": finetune,
        "ablation": ablation,
        "kernels": kernels,
    }
    try:
        _check(args)
        commands[args.bigs_command](args)
    except UsageError as e:
        parser.error(str(e))
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
    encoder = build_encoder(
        key,
        vocab_size=tok.vocab_size,
        dim=64,
        num_layers=2,
        dropout=0.1,
        init_std=scaled_init_std(64),
    )
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
    metrics = last_metrics(result.history, "eval")
    uni_loss, uni_acc = unigram_reference(
        train_texts, eval_texts, tok, length, batch_size, seed=seed
    )
    print(
        f"held-out masked tokens: loss {metrics['loss']:.3f} nats (unigram baseline "
        f"{uni_loss:.3f}), accuracy {metrics['accuracy']:.3f} (unigram {uni_acc:.3f})"
    )
    fwd, bwd = model_kernels(result.model, length)
    print(f"kernels: {plot_kernels({'BiGS demo': (fwd, bwd)}, out_dir / 'kernels.png')}")
