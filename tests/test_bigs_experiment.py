"""Behaviour of the `python -m lineax_seq bigs ...` pieces at tiny size."""

import argparse
import csv
import json
import pathlib
import re
import shutil

import numpy as np
import pytest

from lineax_seq.experiments import _bigs, _bigs_ablation, _bigs_kernels, _bigs_train, _cli

TEXTS = [
    "def alpha(x):\n    return x + 1\n" * 6,
    "class Beta:\n    value = 2\n" * 6,
    "import os\nprint(os.sep)\n" * 6,
    "short",
]


# ----------------------------------------------------------------- continuation task


def test_continuation_rows_positive_is_true_continuation():
    rows = _bigs_ablation.continuation_rows(TEXTS, num_rows=40, chars=20, seed=3)
    assert len(rows) == 40
    assert [label for _, _, label in rows].count(1) == 20
    docs = [t for t in TEXTS if len(t) >= 40]
    for a, b, label in rows:
        assert len(a) == len(b) == 20
        continued = any(a + b in d for d in docs)
        source = [d for d in docs if a in d]
        if label == 1:
            assert continued
        else:
            # B comes from a different document than every document containing A.
            assert not any(b in d for d in source)


def test_continuation_rows_deterministic_and_seeded():
    a = _bigs_ablation.continuation_rows(TEXTS, num_rows=10, chars=10, seed=0)
    b = _bigs_ablation.continuation_rows(TEXTS, num_rows=10, chars=10, seed=0)
    c = _bigs_ablation.continuation_rows(TEXTS, num_rows=10, chars=10, seed=1)
    assert a == b
    assert a != c


def test_continuation_rows_bad_input():
    with pytest.raises(ValueError, match="chars"):
        _bigs_ablation.continuation_rows(TEXTS, num_rows=2, chars=0)
    with pytest.raises(ValueError, match="at least 2 documents"):
        _bigs_ablation.continuation_rows(TEXTS, num_rows=2, chars=1000)


# ----------------------------------------------------------------- match task


def test_match_rows_label_is_copy_of_a_after_distractor():
    rows = _bigs_ablation.match_rows(TEXTS, num_rows=60, chars=12, distractor=9, seed=3)
    assert [label for _, _, label in rows] == [i % 2 for i in range(60)]
    docs = [t for t in TEXTS if len(t) >= 24]
    lengths = set()
    for a, pair, label in rows:
        assert len(a) == 12 and 12 <= len(pair) <= 21
        distractor, b = pair[:-12], pair[-12:]
        lengths.add(len(distractor))
        assert (b == a) == bool(label)
        (home,) = [d for d in docs if a in d]  # the toy documents share no 12-grams
        assert b in home  # negatives: other text of A's own document
        assert any(distractor in d for d in TEXTS if d != home)  # from another document
    assert len(lengths) > 5  # the distance between A and B varies


def test_match_rows_deterministic_and_bad_input():
    make = lambda seed, **kw: _bigs_ablation.match_rows(
        TEXTS, num_rows=10, chars=10, distractor=5, seed=seed, **kw
    )
    assert make(0) == make(0) != make(1)
    with pytest.raises(ValueError, match="distractor"):
        _bigs_ablation.match_rows(TEXTS, num_rows=2, chars=5, distractor=-1)
    with pytest.raises(ValueError, match="at least 2 documents"):
        _bigs_ablation.match_rows(TEXTS, num_rows=2, chars=1000, distractor=0)
    with pytest.raises(ValueError, match="too few segments .* repeating themselves"):
        _bigs_ablation.match_rows(["a" * 50, "b" * 50], num_rows=4, chars=10, distractor=0)


def test_match_rows_draw_a_alike_for_both_labels():
    """Short documents (under 3 * chars) have negatives only for segments at their
    ends; A is drawn only where a negative exists, so the document A comes from does not
    give the label away."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    short = [letters[i:] + letters[:i] for i in range(5)]  # 26 characters
    long = ["".join(chr(0x100 + 300 * k + i) for i in range(200)) for k in range(5)]
    rows = _bigs_ablation.match_rows(short + long, num_rows=2000, chars=10, distractor=0)
    from_short = np.array([any(a in d for d in short) for a, _, _ in rows])
    labels = np.array([label for _, _, label in rows])
    assert 0.4 < labels[from_short].mean() < 0.6  # was 1.0: short documents gave positives
    two = ["abcdefghijklmnopqrst", "ABCDEFGHIJKLMNOPQRST"]  # 2 * chars: one negative each
    for a, b, label in _bigs_ablation.match_rows(two, num_rows=8, chars=10, distractor=0):
        assert (b == a) == bool(label) and b in (
            "abcdefghij",
            "klmnopqrst",
            "ABCDEFGHIJ",
            "KLMNOPQRST",
        )


def write_rows(rows, path):
    """Write `(text, label)` or `(text, text_pair, label)` rows as the CSV file
    `bigs finetune --train` reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "text_pair", "label"] if len(rows[0]) == 3 else ["text", "label"])
        writer.writerows(rows)
    return path


# ----------------------------------------------------------------- baselines


def test_unigram_baseline_matches_entropy():
    train = np.array([0, 0, 0, 1, 1, 2])
    loss, acc = _bigs_ablation.unigram_baseline(train, train, vocab_size=4)
    counts = np.array([4.0, 3.0, 2.0, 1.0])  # add-one smoothed
    p = counts / counts.sum()
    expected = -(3 * np.log(p[0]) + 2 * np.log(p[1]) + np.log(p[2])) / 6
    assert loss == pytest.approx(expected)
    assert acc == pytest.approx(0.5)
    with pytest.raises(ValueError, match="targets"):
        _bigs_ablation.unigram_baseline(train, np.array([], int), vocab_size=4)
    # The fine-tuning baseline answers the *training* split's majority class.
    majority = _bigs_ablation.majority_accuracy(np.array([0, 0, 1]), np.array([1, 1, 0]))
    assert majority == pytest.approx(1 / 3)


def test_unigram_reference_scores_the_masked_targets_only():
    """The held-out MLM targets of a text of one repeated byte are that byte: the baseline
    is its smoothed unigram log-probability, and the most frequent byte is right always."""
    tok = ls.ByteTokenizer()
    train = ["ab" * 30 + "a" * 20]
    loss, acc = _bigs_ablation.unigram_reference(
        train, ["a" * 200] * 4, tok, length=32, batch_size=2, seed=0, eval_batches=3
    )
    counts = np.bincount(tok.encode(train[0]), minlength=tok.vocab_size) + 1.0
    assert loss == pytest.approx(-np.log(counts[tok.encode("a")[0]] / counts.sum()))
    assert acc == 1.0


# ----------------------------------------------------------------- kernels (Figure 3)


def test_kernel_image_layout_and_scaling():
    length, layers, r = 16, 3, 4
    fwd = np.arange(layers * length, dtype=float).reshape(layers, length) + 1
    bwd = -10 * fwd
    image = _bigs_kernels.kernel_image(fwd, bwd, radius=r)
    assert image.shape == (2 * layers, 2 * r + 1)
    for i in range(layers):
        f_row, b_row = image[2 * i], image[2 * i + 1]
        assert np.all(np.isnan(f_row[r + 1 :])) and np.all(np.isnan(b_row[:r]))
        # Unscaled: relative position -j holds |fwd[j]|, +j holds |bwd[j]|.
        raw_f = np.abs(fwd[i, : r + 1])
        raw_b = np.abs(bwd[i, : r + 1])
        low, high = min(raw_f.min(), raw_b.min()), max(raw_f.max(), raw_b.max())
        np.testing.assert_allclose(f_row[: r + 1][::-1], (raw_f - low) / (high - low))
        np.testing.assert_allclose(b_row[r:], (raw_b - low) / (high - low))
    # Per-channel kernels are averaged in absolute value.
    stacked = np.stack([fwd, -fwd], axis=1)
    np.testing.assert_allclose(
        _bigs_kernels.kernel_image(stacked, stacked, radius=r),
        _bigs_kernels.kernel_image(fwd, fwd, radius=r),
    )


def test_kernel_image_bad_input():
    with pytest.raises(ValueError, match="too short"):
        _bigs_kernels.kernel_image(np.ones((2, 5)), np.ones((2, 5)), radius=10)
    with pytest.raises(ValueError, match="must both have shape"):
        _bigs_kernels.kernel_image(np.ones((2, 20)), np.ones((3, 20)))


def test_plot_kernels_and_ablation_files(tmp_path):
    import matplotlib
    import matplotlib.pyplot as plt

    k = np.random.default_rng(0).normal(size=(2, 32))
    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:  # no pyplot: the backend stays the caller's (it was forced to Agg), no figure open
        figures = plt.get_fignums()
        png = _bigs_kernels.plot_kernels({"a": (k, k), "b": (k[:1], k[:1])}, tmp_path / "k.png")
        assert matplotlib.get_backend() == "svg" and plt.get_fignums() == figures
    finally:
        matplotlib.use(before)
    assert png.stat().st_size > 0
    results = [
        {
            "name": name,
            "params": 1000 + i,
            "params_non_embedding": 500 + i,
            "tokens": 4096,
            "mlm_loss": 3.0 - i / 10,
            "mlm_accuracy": 0.3,
            "finetune_accuracy": 0.6,
            "mlm_curve": [[1, 5.0], [3, 3.5]],
        }
        for i, name in enumerate(["x", "y"])
    ]
    assert _bigs_ablation.plot_ablation(results, tmp_path / "a.png").stat().st_size > 0
    table = _bigs_ablation.ablation_table(results)
    assert table.count("\n") == 3 and "| x | 1,000 (500) | 4,096 | 3.000" in table
    json.dumps(results)


def test_ablation_output_names_do_not_collide():
    name = lambda backend="cpu", quick=False, **cfg: _bigs_ablation.output_suffix(
        {"steps": 500, "seed": 0, "finetune_task": "listops", "finetune_steps": 300, **cfg},
        quick=quick,
        backend=backend,
    )
    assert name() == ""  # the committed default run
    assert name(seed=1) == "_seed1"
    assert name(steps=2000) == "_2000steps"
    assert name(steps=2000, seed=2, backend="gpu") == "_gpu_2000steps_seed2"
    assert name(finetune_task="match", seed=1) == "_match_seed1"
    assert name(finetune_task="match", finetune_steps=1500) == "_match_1500ftsteps"
    assert name(steps=30, quick=True) == "_quick"


# ----------------------------------------------------------------- CLI


def _parse(argv):
    parser = argparse.ArgumentParser()
    _bigs.add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_parses_subcommands():
    args = _parse(["pretrain", "--steps", "3", "--length", "512", "--init-from", "ck"])
    assert (args.bigs_command, args.steps, args.length, str(args.init_from)) == (
        "pretrain",
        3,
        512,
        "ck",
    )
    assert args.architecture == "gated" and args.routing == "ssm"
    args = _parse(["finetune", "--checkpoint", "ck", "--task", "listops"])
    assert args.task == "listops"
    assert _parse(["ablation", "--quick"]).quick
    assert _parse(["kernels", "--checkpoint", "a", "b"]).checkpoint[1].name == "b"
    with pytest.raises(SystemExit):
        _parse(["pretrain", "--resume", "--init-from", "x"])
    with pytest.raises(SystemExit):
        _parse([])
    for bad in (["--dim", "0"], ["--layers", "-1"], ["--init-std", "0"], ["--init-std", "nan"]):
        with pytest.raises(SystemExit):
            _parse(["pretrain", *bad])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["pretrain", "--max-files", "-1"], "'-1' is not a positive integer"),
        (["pretrain", "--eval-every", "-1"], "'-1' is not a non-negative integer"),
        (["pretrain", "--mask-rate", "0"], r"'0' is not a number in \(0, 1\]"),
        (["pretrain", "--dropout", "1"], r"'1' is not a dropout rate in \[0, 1\)"),
        (["pretrain", "--ssm-lr", "nan"], "'nan' is not a non-negative finite number"),
        (["kernels", "--checkpoint", "a", "--radius", "-1"], "'-1' is not a positive integer"),
    ],
)
def test_cli_rejects_bad_numbers(argv, message, capsys):
    with pytest.raises(SystemExit):
        _parse(argv)
    assert re.search(message, capsys.readouterr().err)


def test_pretrain_checks_the_length_before_writing(tmp_path):
    out = tmp_path / "run"
    args = _parse(["pretrain", "--tokenizer", "byte", "--length", "2", "--out", str(out)])
    with pytest.raises(ValueError, match="--length 2: masked-LM sequences need at least 3"):
        _bigs.pretrain(args)
    assert not out.exists()


def test_ablation_writes_after_every_variant(tmp_path, monkeypatch):
    # Training stubbed out: what is checked is which variants run and what is written.
    ran, stop = [], {"after": None}

    def fake_variant(architecture, routing, cfg, **kwargs):
        if len(ran) == stop["after"]:
            raise KeyboardInterrupt  # stopped during the next variant
        ran.append(f"{architecture}/{routing}")
        name = _bigs_ablation.VARIANT_LABELS[architecture, routing]
        row = dict(
            name=name,
            architecture=architecture,
            routing=routing,
            params=10,
            params_non_embedding=5,
            tokens=64,
            mlm_loss=2.0,
            mlm_accuracy=0.5,
            finetune_accuracy={"gated": 0.75, "stack": 0.5}[architecture],
            mlm_curve=[[0, 3.0], [1, 2.0]],
        )
        return row, None

    monkeypatch.setattr(_bigs_ablation, "_run_variant", fake_variant)
    monkeypatch.setattr(
        _bigs_ablation, "model_kernels", lambda model, length: (np.ones((1, 32)),) * 2
    )
    argv = ["ablation", "--quick", "--max-files", "4", "--out", str(tmp_path)]
    # Any order given runs in the table's order; the last write is the whole run.
    payload = _bigs_ablation.ablation(_parse([*argv, "--variants", "stack/ssm", "gated/ssm"]))
    assert ran == ["gated/ssm", "stack/ssm"] and payload["complete"]
    assert payload["gated_minus_stack_ssm_finetune_accuracy"] == 0.25
    (written,) = tmp_path.glob("bigs_ablation*.json")
    assert json.loads(written.read_text())["complete"]
    assert not list(tmp_path.glob("*_partial.*"))  # written while it ran, then removed
    # All four, then all four again stopped in the third: `_partial` files hold the two
    # finished ones, and the finished table is kept (the partial one replaced it).
    ran.clear()
    _bigs_ablation.ablation(_parse(argv))
    (finished,) = set(tmp_path.glob("bigs_ablation*.json")) - {written}
    before = finished.read_text()
    ran.clear()
    stop["after"] = 2
    with pytest.raises(KeyboardInterrupt):
        _bigs_ablation.ablation(_parse(argv))
    assert ran == ["gated/ssm", "stack/ssm"] and finished.read_text() == before
    partial = finished.with_name(finished.stem + "_partial.json")
    saved = json.loads(partial.read_text())
    assert not saved["complete"] and [r["name"] for r in saved["results"]] == [
        "GATED / SSM (BiGS)",
        "STACK / SSM",
    ]
    assert "Partial: 2 of 4 variants" in partial.with_suffix(".md").read_text()
    with pytest.raises(SystemExit):
        _parse([*argv, "--variants", "gated/rnn"])
    # Refused before any variant runs (they were found at the end, after all the
    # training): an output name taken by a directory, a batch larger than the corpus.
    ran.clear()
    stop["after"] = None
    finished.unlink()
    finished.mkdir()
    with pytest.raises(ValueError, match=f"--out {re.escape(str(finished))}: is a directory"):
        _bigs_ablation.ablation(_parse(argv))
    finished.rmdir()
    big = ["ablation", "--max-files", "4", "--tokenizer", "byte", "--length", "4096"]
    big += ["--batch-size", "64", "--finetune-examples", "16", "--out", str(tmp_path)]
    with pytest.raises(ValueError, match=r"the stdlib corpus: batch_size=64 is larger than the"):
        _bigs_ablation.ablation(_parse(big))
    assert ran == []


def test_ablation_rows_report_the_held_out_metrics(monkeypatch):
    """A variant's row reads the last *eval* records of pretraining and fine-tuning (the
    training records, logged alongside, would flatter every variant)."""
    import types

    def run(model, history):
        return types.SimpleNamespace(model=model, history=history)

    pretrain = [
        {"split": "train", "step": 1, "loss": 1.0, "accuracy": 0.9, "tokens_per_s": 5.0},
        {"split": "eval", "step": 1, "loss": 2.5, "accuracy": 0.3},
    ]
    finetune = [
        {"split": "train", "step": 1, "loss": 0.1, "accuracy": 0.95},
        {"split": "eval", "step": 1, "loss": 0.7, "accuracy": 0.6},
    ]
    monkeypatch.setattr(_bigs_ablation, "pretrain_mlm", lambda mlm, *a, **k: run(mlm, pretrain))
    monkeypatch.setattr(
        _bigs_ablation, "finetune_classifier", lambda clf, *a, **k: run(clf, finetune)
    )
    cfg = _bigs_ablation.effective_settings(_parse(["ablation", "--quick"]))
    base = dict(vocab_size=40, dim=cfg["dim"], num_layers=cfg["layers"], dropout=0.1)
    abstract = eqx.filter_eval_shape(lambda: ls.BiGS(**base, key=jr.key(0)))
    target = _bigs_ablation.parameter_counts(abstract)["params_non_embedding"]
    row, _ = _bigs_ablation._run_variant(
        "gated", "ssm", cfg, base=base, target_params=target, corpus=([], []),
        tok=ls.ByteTokenizer(), task=([], [], 2),
    )  # fmt: skip
    assert (row["mlm_loss"], row["mlm_accuracy"]) == (2.5, 0.3)
    assert (row["finetune_loss"], row["finetune_accuracy"]) == (0.7, 0.6)


def test_kernels_out_may_be_any_existing_directory(tmp_path, monkeypatch):
    """`kernels` writes `kernels.png` into an existing `--out` directory whatever its
    name; the up-front check refused one named like a file (`maps.png`)."""
    monkeypatch.setattr(_bigs, "_run_problem", lambda flag, run_dir: None)  # runs: fine
    out = tmp_path / "maps.png"
    out.mkdir()
    check = lambda: _bigs._kernels_problem(
        _parse(["kernels", "--checkpoint", "a", "--out", str(out)])
    )
    assert check() is None
    (out / "kernels.png").mkdir()
    assert re.search(r"--out .*kernels.png: is a directory", check())


def test_ablation_default_out_is_the_checkouts_results(tmp_path):
    # A source checkout: its benchmarks/results (the committed results are rerun in place).
    checkout = pathlib.Path(_cli.__file__).parents[2]
    assert _bigs_ablation.RESULTS_DIR == checkout / "benchmarks" / "results"
    (tmp_path / "benchmarks").mkdir()
    # A `benchmarks/` directory alone (another wheel's, in site-packages) is not one.
    assert _cli.results_dir(tmp_path) == pathlib.Path("benchmarks/results")
    (tmp_path / "pyproject.toml").touch()
    assert _cli.results_dir(tmp_path) == tmp_path / "benchmarks" / "results"
    # Installed without a checkout: under the current directory, as `koopman` does.
    assert _cli.results_dir(tmp_path / "site-packages") == pathlib.Path("benchmarks/results")


# ----------------------------------------------------------------- models, losses, optimiser

import equinox as eqx  # noqa: E402
import grain  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jax.random as jr  # noqa: E402
import optax  # noqa: E402

import lineax_seq as ls  # noqa: E402


@pytest.fixture(scope="module")
def tiny_mlm():
    # One compiled program instead of op-by-op construction (much faster to build).
    build = lambda k: ls.BiGS(20, 8, 2, inner_dim=12, state_size=4, dropout=0.0, key=k)
    return _bigs_train.MaskedLM(eqx.filter_jit(build)(jr.key(0)), key=jr.key(1))


def test_models_give_their_heads_the_encoders_init_std():
    build = lambda k: ls.BiGS(20, 64, 1, inner_dim=12, state_size=4, init_std=0.16, key=k)
    encoder = eqx.filter_jit(build)(jr.key(0))
    mlm = _bigs_train.MaskedLM(encoder, key=jr.key(1))
    classifier = _bigs_train.Classifier(encoder, 64, key=jr.key(2))
    for linear in (mlm.head.transform, classifier.head.pooler, classifier.head.classifier):
        assert 0.12 < float(jnp.std(linear.weight)) < 0.16  # 0.88 * 0.16 = 0.14


def test_mlm_loss_matches_direct_computation(tiny_mlm):
    rng = np.random.default_rng(0)
    tokens = rng.integers(7, 20, size=(2, 10)).astype(np.int32)
    mask = np.ones((2, 10), bool)
    mask[1, 7:] = False
    labels = np.full((2, 10), -100, np.int32)
    labels[0, [1, 4]] = [9, 11]
    labels[1, [0, 2, 5]] = [8, 12, 19]
    batch = {"tokens": tokens, "padding_mask": mask, "labels": labels}
    loss_fn = eqx.filter_jit(_bigs_train.mlm_loss)
    loss, aux = loss_fn(tiny_mlm, batch, jr.key(0), max_masked=4, inference=True)

    # Reference: full-vocabulary logits at every position, then pick the labelled ones.
    @eqx.filter_jit
    def all_logits(model, tokens, mask):
        h = model.encoder(tokens, mask, inference=True)
        return model.head(h, model.encoder.token_embedding.weight)

    nll, hits = [], []
    for b in range(2):
        logits = all_logits(tiny_mlm, jnp.asarray(tokens[b]), jnp.asarray(mask[b]))
        for t in np.flatnonzero(labels[b] >= 0):
            nll.append(-jax.nn.log_softmax(logits[t])[labels[b, t]])
            hits.append(int(jnp.argmax(logits[t]) == labels[b, t]))
    assert float(loss) == pytest.approx(float(np.mean(nll)), rel=1e-5)
    assert float(aux["accuracy"]) == pytest.approx(np.mean(hits))


def test_max_predictions_covers_masking():
    assert _bigs_train.max_predictions(128, 0.15) >= 19 + 3 * 4
    assert _bigs_train.max_predictions(4, 0.5) <= 4


def test_optimizer_groups_ssm_parameters(tiny_mlm):
    groups = _bigs_train.ssm_groups(tiny_mlm, lr=0.1, ssm_lr=0.01)
    assert groups["ssm"].learning_rate == 0.01 and groups["ssm"].weight_decay == 0.0
    for ssm_lr, used in ((0.5, 0.1), (0.0, 0.1), (0.01, 0.01)):  # capped at lr; 0 means lr
        assert _bigs_train.ssm_groups(tiny_mlm, lr=0.1, ssm_lr=ssm_lr)["ssm"].learning_rate == used
    labels = jax.tree_util.tree_flatten_with_path(ls.param_labels(tiny_mlm, groups))[0]
    ssm = [jax.tree_util.keystr(p) for p, label in labels if label == "ssm"]
    # Exactly the arrays of the S4D kernels (A, B, C, dt of each direction) are grouped.
    kernels = [
        x
        for x in jax.tree.leaves(tiny_mlm, is_leaf=lambda x: isinstance(x, ls.S4DKernel))
        if isinstance(x, ls.S4DKernel)
    ]
    assert len(ssm) == sum(
        len(jax.tree.leaves(eqx.filter(k, eqx.is_inexact_array))) for k in kernels
    )
    assert ssm and all("kernel_fn" in p for p in ssm)
    assert _bigs_train.ssm_groups({"w": jnp.ones(2)}, lr=0.1, ssm_lr=0.01) == {}
    # Zero gradients: decoupled weight decay moves ordinary weights but not SSM ones.
    opt = _bigs_train.paper_optimizer(
        tiny_mlm, lr=0.1, steps=10, warmup=0.0, weight_decay=0.5, ssm_lr=0.1
    )
    params = eqx.filter(tiny_mlm, eqx.is_inexact_array)

    @eqx.filter_jit
    def zero_grad_update(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return opt.update(zeros, opt.init(params), params)[0]

    updates = zero_grad_update(params)
    moved = eqx.apply_updates(tiny_mlm, updates)
    # ... nor biases and LayerNorm gains (BERT's and the reference's decay mask).
    unmoved = lambda m: (
        m.encoder.layers.forward_routing.kernel_fn.c_real,
        m.encoder.layers.norm.weight,
        m.encoder.layers.v_proj.bias,
        m.encoder.final_norm.weight,
        m.head.norm.weight,
        m.head.bias,
    )
    for a, b in zip(unmoved(moved), unmoved(tiny_mlm), strict=True):
        np.testing.assert_array_equal(a, b)
    for dense in (lambda m: m.encoder.layers.v_proj.weight, lambda m: m.head.transform.weight):
        assert not np.allclose(dense(moved), dense(tiny_mlm))


@pytest.mark.parametrize(
    "architecture, routing",
    [("gated", "ssm"), ("stack", "ssm"), ("gated", "attention"), ("stack", "attention")],
)
def test_optimizer_decays_no_bias_or_layer_norm(architecture, routing):
    # With zero gradients, `paper_optimizer`'s update is its weight decay alone: none
    # on any LayerNorm array or bias of each variant, with an MLM or a classification
    # head, and some on every weight matrix.
    attention = routing == "attention"
    encoder = ls.BiGS(
        20,
        8,
        1,
        architecture=architecture,
        routing=routing,
        inner_dim=12,
        state_size=4,
        num_heads=2 if attention else None,
        max_length=16 if attention else None,
        num_token_types=2,
        key=jr.key(0),
    )
    for model in (
        _bigs_train.MaskedLM(encoder, key=jr.key(1)),
        _bigs_train.Classifier(encoder, 3, key=jr.key(1)),
    ):
        opt = _bigs_train.paper_optimizer(
            model, lr=0.1, steps=10, warmup=0.0, weight_decay=0.5, ssm_lr=0.1
        )
        params = eqx.filter(model, eqx.is_inexact_array)
        zeros = jax.tree.map(jnp.zeros_like, params)
        with jax.numpy_dtype_promotion("standard"):  # optax's bias correction
            updates = opt.update(zeros, opt.init(params), params)[0]
        is_norm = lambda x: isinstance(x, eqx.nn.LayerNorm)
        norms = [x for x in jax.tree.leaves(updates, is_leaf=is_norm) if is_norm(x)]
        assert norms and all(not jnp.any(u) for u in jax.tree.leaves(norms))
        flat = jax.tree_util.tree_flatten_with_path(updates)[0]
        moved = {jax.tree_util.keystr(p): bool(jnp.any(u)) for p, u in flat}
        assert not any(m for p, m in moved.items() if p.endswith(".bias"))
        weights = [m for p, m in moved.items() if p.endswith("proj.weight")]
        assert weights and all(weights)
        assert moved[".encoder.token_embedding.weight"]
    assert _bigs_train.no_decay_groups({"w": jnp.ones(2)}) == {}


def test_optimizer_is_adamw_098_1e6_with_warmup_cosine():
    # A model without SSM kernels: one group, so the chain must equal plain optax.adamw
    # with the paper's betas/eps and a warmup + cosine schedule (no clipping).
    params = {"w": jnp.array([1.0, -2.0, 3.0]), "b": jnp.array([0.5])}
    opt = _bigs_train.paper_optimizer(
        params, lr=0.1, steps=100, warmup=0.1, weight_decay=0.01, ssm_lr=0.0
    )
    schedule = opt.learning_rate_schedule
    cosine = lambda t: 0.05 * (1 + np.cos(np.pi * (t - 10) / 90))
    for step, expected in [(0, 0.0), (5, 0.05), (10, 0.1), (55, cosine(55)), (100, 0.0)]:
        assert float(schedule(step)) == pytest.approx(expected, abs=1e-7), step
    grads = [
        {"w": jnp.array([0.3, -1e-7, 2.0]), "b": jnp.array([1.0])},
        {"w": jnp.array([-0.1, 4.0, 0.0]), "b": jnp.array([0.2])},
    ]

    def run(optimizer):  # 12 updates: past the warmup, where lr > 0
        state, p = optimizer.init(params), params
        for _ in range(6):
            for g in grads:
                u, state = optimizer.update(g, state, p)
                p = optax.apply_updates(p, u)
        return p

    ours = run(opt)
    # optax's bias correction needs standard promotion (the tests run strict).
    with jax.numpy_dtype_promotion("standard"):
        paper = run(optax.adamw(schedule, b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.01))
        default = run(optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01))
    for k in params:
        np.testing.assert_allclose(ours[k], paper[k], rtol=1e-6, atol=1e-7)
    # Adam's defaults (b2 0.999, eps 1e-8) end elsewhere: the test can tell them apart.
    assert not np.allclose(default["w"], ours["w"], rtol=1e-6, atol=1e-7)


def test_matched_inner_dim_matches_parameters():
    base = dict(vocab_size=50, dim=16, num_layers=2)
    abstract = eqx.filter_eval_shape(lambda: ls.BiGS(**base, key=jr.key(0)))
    target = _bigs_train.parameter_counts(abstract)["params_non_embedding"]
    for arch, routing in _bigs_ablation.VARIANTS:
        config = dict(base, architecture=arch, routing=routing)
        inner = _bigs_train.matched_inner_dim(config, target)
        built = eqx.filter_eval_shape(ls.BiGS, **config, inner_dim=inner, key=jr.key(0))
        got = _bigs_train.parameter_counts(built)
        assert abs(got["params_non_embedding"] - target) <= 0.02 * target, (arch, routing)


def test_classification_loss_regression_and_classes(tiny_mlm):
    batch = {
        "tokens": np.full((3, 6), 9, np.int32),
        "padding_mask": np.ones((3, 6), bool),
        "label": np.array([0, 2, 1], np.int32),
    }
    clf = _bigs_train.Classifier(tiny_mlm.encoder, 3, key=jr.key(2))
    loss_fn = eqx.filter_jit(_bigs_train.classification_loss)
    loss, aux = loss_fn(clf, batch, jr.key(0), inference=True)
    logits = eqx.filter_jit(jax.vmap(lambda t, m: clf(t, m, inference=True)))(
        batch["tokens"], batch["padding_mask"]
    )
    expected = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)
    reg = _bigs_train.Classifier(tiny_mlm.encoder, 1, key=jr.key(2))
    batch["label"] = np.array([0.5, -1.0, 2.0], np.float32)
    loss, aux = loss_fn(reg, batch, jr.key(0), inference=True)
    out = eqx.filter_jit(jax.vmap(lambda t, m: reg(t, m, inference=True)))(
        batch["tokens"], batch["padding_mask"]
    )[:, 0]
    assert float(loss) == pytest.approx(float(jnp.mean((out - batch["label"]) ** 2)), rel=1e-5)
    assert float(aux["mae"]) == pytest.approx(float(jnp.mean(jnp.abs(out - batch["label"]))))


def test_classification_loss_feeds_segment_ids_to_an_encoder_with_token_types():
    tok = ls.ByteTokenizer()
    pair = [{"text": "ab", "text_pair": "cd", "label": 1}, {"text": "xy", "label": 0}]
    batch = next(iter(ls.classification_dataset(
        grain.MapDataset.source(pair), tok, length=8, batch_size=2, shuffle=False
    )))  # fmt: skip
    loss_fn = eqx.filter_jit(_bigs_train.classification_loss)
    for types in (0, 2):
        build = lambda k, types=types: ls.BiGS(
            tok.vocab_size, 8, 1, inner_dim=12, state_size=4, num_token_types=types, key=k
        )
        clf = _bigs_train.Classifier(eqx.filter_jit(build)(jr.key(0)), 2, key=jr.key(1))
        loss, _ = loss_fn(clf, batch, jr.key(0), inference=True)
        call = lambda t, m, s, clf=clf: clf(t, m, s, inference=True)
        segments = batch["token_types"] if types else None
        logits = eqx.filter_jit(jax.vmap(call))(batch["tokens"], batch["padding_mask"], segments)
        expected = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        assert float(loss) == pytest.approx(float(expected), rel=1e-6)
        if types:  # the pair's second segment gets type 1, which changes its logits
            plain = eqx.filter_jit(jax.vmap(lambda t, m, clf=clf: clf(t, m, inference=True)))(
                batch["tokens"], batch["padding_mask"]
            )
            assert not np.allclose(plain[0], logits[0])
            np.testing.assert_allclose(plain[1], logits[1], rtol=1e-6)  # one segment


# ----------------------------------------------------------------- CLI end to end (tiny)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    words = ["def", "return", "self", "import", "class", "(x)", ":", "\n    ", "=", "1"]
    for i in range(100):  # enough for a non-empty hash-split held-out part
        text = " ".join(rng.choice(words, size=100))
        (root / f"f{i:02d}.py").write_text(text)
    return root


@pytest.fixture(scope="module")
def pretrained(corpus_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    # The default corpus (no --corpus): the standard library's .py sources.
    argv = [
        "pretrain", "--max-files", "12", "--tokenizer", "byte", "--dim", "16",
        "--layers", "1", "--state-size", "4", "--length", "32", "--batch-size", "4",
        "--steps", "3", "--out", str(out),
    ]  # fmt: skip
    metrics = _bigs.pretrain(_parse(argv))
    return out, argv, metrics


def test_pretrain_writes_run(pretrained):
    out, _, metrics = pretrained
    assert {"loss", "accuracy"} <= set(metrics)
    assert np.isfinite(metrics["loss"])
    for name in ("config.json", "metrics.jsonl", "kernels.png", "final", "checkpoints"):
        assert (out / name).exists(), name
    # Trained on standard-library sources, i.e. real Python code.
    train, held = _bigs_train.load_corpus(None, 12)
    assert len(train) == 12 and held and all("def " in t or "import" in t for t in train[:3])
    model, tok, config = _bigs_train.load_pretrained(out)
    assert config["pretrain"]["corpus"] is None
    assert config["model"]["dim"] == 16 and tok.vocab_size == model.encoder.vocab_size
    # The CLI's default initial scale: BERT's 0.02 at d = 1024, 0.02 sqrt(1024 / d) here.
    assert config["model"]["init_std"] == pytest.approx(0.16)
    # The same weights run at a longer length (kernels are generated for it).
    h = model.encoder(jnp.full((200,), 9, jnp.int32), inference=True)
    assert h.shape == (200, 16)


def test_pretrain_attention_learns_berts_positions(pretrained, corpus_dir, tmp_path):
    # Attention routing learns max(--length, 512) positions, as BERT: a model pretrained
    # at 32 tokens continues at 512 (with --init-from), and no further.
    _, argv, _ = pretrained
    attention = [*argv, "--corpus", str(corpus_dir), "--routing", "attention", "--heads", "2"]
    attention[attention.index("--out") + 1] = str(tmp_path)
    models = {}
    for length in (32, 600):
        attention[attention.index("--length") + 1] = str(length)
        models[length] = _bigs._pretrain_inputs(_parse(attention))[1]
    assert (models[32].encoder.max_length, models[600].encoder.max_length) == (512, 600)
    model = models[32]
    assert _bigs._length_problem(model, 512, "x") is None
    assert _bigs._length_problem(model, 513, "--init-from x") == (
        "--length 513: --init-from x has attention routing with absolute positions up to "
        "512; use --length 512 or less"
    )


def test_pretrain_packs_documents_on_request(pretrained, corpus_dir, tmp_path):
    _, argv, _ = pretrained
    args = [*argv, "--corpus", str(corpus_dir)]
    args[args.index("--out") + 1] = str(tmp_path)
    padding = {}
    for flag in ("--no-pack", "--pack"):
        parsed = _parse([*args, flag])
        assert parsed.pack == (flag == "--pack") and "pack" in parsed.given_options
        _, held_out = _bigs._pretrain_inputs(parsed)[3][1]
        masks = np.concatenate([b["padding_mask"] for b in held_out])
        padding[flag] = 1 - masks.mean()
    # Each 100-word document ends in a padded sequence, unless they are joined.
    assert padding["--pack"] < 0.01 < padding["--no-pack"]
    assert not _parse(args).pack


def test_pretrain_resume_and_init_from(pretrained, corpus_dir, tmp_path, capsys):
    out, argv, _ = pretrained
    steps = argv.index("--steps") + 1
    resumed = [*argv[:steps], "4", *argv[steps + 1 :], "--resume"]
    _bigs.pretrain(_parse(resumed))
    assert ls.list_checkpoints(out / "final")[-1].name.endswith("4")
    # Continued pretraining at twice the length, from the checkpoint, on a text path.
    longer = [*argv[: argv.index("--out")], "--out", str(tmp_path), "--init-from", str(out)]
    longer[longer.index("--length") + 1] = "64"
    metrics = _bigs.pretrain(_parse([*longer, "--corpus", str(corpus_dir)]))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["init_from"] == str(out) and config["pretrain"]["length"] == 64
    # The checkpoint's model is recorded, not the parser's ignored model options.
    assert "dim" not in config["pretrain"] and config["model"]["dim"] == 16
    original = json.loads((out / "config.json").read_text())
    assert original["pretrain"]["steps"] == 3 and original["resumed"][-1]["steps"] == 4
    assert config["pretrain"]["corpus"] == str(corpus_dir) and np.isfinite(metrics["loss"])
    start = _bigs_train.load_pretrained(out)[0].encoder.token_embedding.weight
    continued = _bigs_train.load_pretrained(tmp_path)[0].encoder.token_embedding.weight
    # It started from the checkpoint (3 small Adam steps away), not from a fresh init.
    assert 0 < float(jnp.max(jnp.abs(continued - start))) < 0.01
    # Without --corpus it continues on the corpus it starts from (it took the default,
    # the standard library, with another run's tokenizer and weights).
    again = [*longer[: longer.index("--max-files")], *longer[longer.index("--max-files") + 2 :]]
    again[again.index("--out") + 1] = str(tmp_path / "again")
    again[again.index("--init-from") + 1] = str(tmp_path)
    again[again.index("--steps") + 1] = "1"
    _bigs.pretrain(_parse(again))
    record = json.loads((tmp_path / "again" / "config.json").read_text())["pretrain"]
    assert (record["corpus"], record["max_files"]) == (str(corpus_dir), 12)
    printed = capsys.readouterr().out
    assert "pretraining on its corpus (--corpus " in printed
    # The model options given are named as ignored (they were, silently).
    ignored = "ignored: --tokenizer, --dim, --layers, --state-size\n"
    assert f"note: --init-from uses the checkpoint's model; {ignored}" in printed
    assert f"note: --resume uses the checkpoint's model; {ignored}" in printed


def test_finetune_file_and_kernels(pretrained, tmp_path):
    out, _, _ = pretrained
    # 10 classes and the same settings as the ListOps test below: one compiled step.
    # The classes are named (c0 ... c9), as in files whose labels are words.
    rows = [(f"x{'y' * (i % 5)}", f"c{i % 10}") for i in range(40)]
    train = write_rows(rows, tmp_path / "train.csv")
    held = tmp_path / "held.jsonl"  # CSV for training, JSONL for evaluation
    held.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows[:8]))
    args = _parse(
        ["finetune", "--checkpoint", str(out), "--train", str(train), "--eval", str(held),
         "--steps", "2", "--batch-size", "4", "--length", "16", "--out", str(tmp_path / "ft")]
    )  # fmt: skip
    metrics = _bigs.finetune(args)
    assert 0.0 <= metrics["accuracy"] <= 1.0
    result = json.loads((tmp_path / "ft" / "result.json").read_text())
    assert result["label_names"] == [f"c{i}" for i in range(10)]
    # The SSM group's rate as used: --ssm-lr (1e-3) capped at the fine-tuning --lr.
    assert (result["ssm_lr"], result["ssm_lr_used"]) == (1e-3, result["lr"]) != (1e-3, 1e-3)
    ids = write_rows([(t, int(y[1])) for t, y in rows], tmp_path / "ids.csv")
    with pytest.raises(
        ValueError,
        match="--eval .*held.jsonl: .*class names .* where the training file has class ids",
    ):
        _bigs.finetune(_parse(["finetune", "--checkpoint", str(out), "--train", str(ids),
                               "--eval", str(held), "--out", str(tmp_path / "ft2")]))  # fmt: skip
    png = _bigs.kernels(
        _parse(["kernels", "--checkpoint", str(out), "--out", str(tmp_path / "k.png")])
    )
    assert png.stat().st_size > 0
    # An existing directory gets kernels.png inside it (it wrote `<dir>.png` beside it).
    into = _bigs.kernels(_parse(["kernels", "--checkpoint", str(out), "--out", str(tmp_path)]))
    assert into == tmp_path / "kernels.png" and into.stat().st_size > 0
    with pytest.raises(ValueError, match="--regression"):
        bad = write_rows([("a", 0.5), ("b", 1.5)] * 8, tmp_path / "reg.csv")
        _bigs.finetune(_parse(["finetune", "--checkpoint", str(out), "--train", str(bad)]))
    with pytest.raises(ValueError, match="not a `bigs pretrain` output"):
        _bigs_train.load_pretrained(tmp_path)


def test_read_rows_regression_and_pairs(tmp_path):
    # Regression (`--regression`): real labels, one output; the loss is tested above.
    path = tmp_path / "reg.jsonl"
    rows = [{"text": "a" * (1 + i), "text_pair": "b", "label": 0.25 * i} for i in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records, outputs, names = _bigs_train.read_rows(path, regression=True)
    assert (
        outputs == 1
        and names is None
        and [records[i]["label"] for i in range(6)] == [r["label"] for r in rows]
    )
    assert records[2]["text_pair"] == "b"
    csv_path = write_rows([("x", 3), ("y", 0)], tmp_path / "cls.csv")
    records, outputs, names = _bigs_train.read_rows(csv_path, regression=False)
    assert outputs == 4 and records[0]["label"] == 3 and names is None
    # Class names: numbered in sorted order; a held-out file reuses the training names.
    named = write_rows([("x", "pos"), ("y", "neg"), ("z", "pos")], tmp_path / "n.csv")
    records, outputs, names = _bigs_train.read_rows(named, regression=False)
    assert (outputs, names) == (2, ("neg", "pos"))
    assert [records[i]["label"] for i in range(3)] == [1, 0, 1]
    held = write_rows([("w", "pos")], tmp_path / "h.csv")
    records, outputs, _ = _bigs_train.read_rows(held, regression=False, label_names=names)
    assert outputs == 2 and records[0]["label"] == 1
    # Whole-number floats are class ids; JSON booleans are refused with a way out.
    floats = tmp_path / "f.jsonl"
    floats.write_text(
        "".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in [("a", 1.0), ("b", 0)])
    )
    records, outputs, float_names = _bigs_train.read_rows(floats, regression=False)
    assert (outputs, float_names, records[0]["label"]) == (2, None, 1)
    floats.write_text(json.dumps({"text": "a", "label": True}) + "\n")
    with pytest.raises(
        ValueError, match=r"f.jsonl:1: label True is a JSON boolean; write class ids"
    ):
        _bigs_train.read_rows(floats, regression=False)
    header_only = tmp_path / "e.csv"
    header_only.write_text("text,label\n")
    with pytest.raises(ValueError, match="e.csv' contains no examples"):
        _bigs_train.read_rows(header_only, regression=False)
    unseen = write_rows([("w", "meh")], tmp_path / "u.csv")
    with pytest.raises(ValueError, match=r"u.csv:2: label 'meh' is not one of"):
        _bigs_train.read_rows(unseen, regression=False, label_names=names)
    for rows, message in [
        ([("a", 0.5), ("b", 2)], "numbers but not class ids .* --regression"),
        ([("a", -1), ("b", 1)], r"not class ids 0, 1, ... \(e.g. -1.0\).* or as names"),
        ([("a", "pos"), ("b", "pos")], "every label is 'pos'"),
        ([("a", "pos"), ("b", " ")], "b.csv:3: empty label"),
        # A typo among class ids made every label a name, sorted: class 10 became 2.
        (
            [*((str(i), i) for i in range(11)), ("t", "3x")],
            r"b.csv: the labels mix numbers \(11 rows: 0, 1, 2, 3, 4, \.\.\.\) and names "
            r"\(1 row: '3x'\); give every row a class id 0, 1, \.\.\., or every row a",
        ),
        ([("a", 0), ("b", "pos")], r"mix numbers \(1 row: 0\) and names \(1 row: 'pos'\)"),
    ]:
        with pytest.raises(ValueError, match=message):
            _bigs_train.read_rows(write_rows(rows, tmp_path / "b.csv"), regression=False)


def test_read_rows_pairs_in_every_row_or_none(tmp_path):
    """Whether a task is sentence pairs was decided from the first JSON object only: a
    file whose first row lacked text_pair lost every pair silently."""
    path = tmp_path / "m.jsonl"
    single = lambda i: {"text": f"a{i}", "label": i % 2}
    pair = lambda i: {"text": f"a{i}", "text_pair": f"b{i}", "label": i % 2}
    for rows, message in (
        ([single(0), pair(1), pair(2)], r"m.jsonl:2: a 'text_pair' field, but line 1 has none"),
        ([pair(0), pair(1), single(2)], r"m.jsonl:3: no 'text_pair' field, but line 1 has one"),
    ):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        for regression in (False, True):
            with pytest.raises(ValueError, match=message + ".* all sentence pairs or all single"):
                _bigs_train.read_rows(path, regression=regression)
    path.write_text("".join(json.dumps(pair(i)) + "\n" for i in range(3)))
    records, outputs, _ = _bigs_train.read_rows(path, regression=False)
    assert outputs == 2 and [records[i]["text_pair"] for i in range(3)] == ["b0", "b1", "b2"]
    # Pairs are encoded with the keyword's truncation ("end" unless asked).
    tok = ls.ByteTokenizer()
    long = ls.read_classification(path, num_classes=2, pair_field="text_pair").map(
        lambda r: {**r, "text": r["text"] * 10}
    )
    for kw, expected in (
        ({}, [tok.cls_id, *tok.encode("a0a0a0a")]),  # "end": the pair is cut off
        ({"truncation": "longest_first"}, [tok.cls_id, *tok.encode("a0a"), tok.sep_id,
                                           *tok.encode("b0"), tok.sep_id]),
    ):  # fmt: skip
        data = _bigs_train.classification_data(
            long, tok, length=8, batch_size=3, seed=0, train=False, **kw
        )
        np.testing.assert_array_equal(next(iter(data))["tokens"][0], expected)
    # An unquoted comma in a CSV text: the label column shifted ('meh, 0,1' read as 0).
    csv_path = tmp_path / "c.csv"
    csv_path.write_text("text,label\ngood,1\nmeh, 0,1\nbad,0\n")
    with pytest.raises(ValueError, match=r"c.csv:3: 3 field\(s\), but the header has 2"):
        _bigs_train.read_rows(csv_path, regression=False)


def test_finetune_listops(pretrained, tmp_path):
    out, _, _ = pretrained
    args = [
        "finetune", "--checkpoint", str(out), "--task", "listops", "--listops-examples", "40",
        "--steps", "2", "--batch-size", "4", "--length", "16", "--out", str(tmp_path),
    ]  # fmt: skip
    metrics = _bigs.finetune(_parse(args))
    assert 0.0 <= metrics["accuracy"] <= 1.0
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["task"] == "listops" and result["checkpoint"] == str(out)
    # The fine-tuned model is saved: its encoder moved away from the pretrained one.
    model, tok, summary = _bigs_train.load_finetuned(tmp_path)
    pretrained, _, _ = _bigs_train.load_pretrained(out)
    assert summary == result and tok.vocab_size == model.encoder.vocab_size
    assert model.head.num_outputs == summary["num_outputs"] == 10  # ListOps: values 0-9
    moved = jax.tree.map(
        lambda a, b: bool(jnp.any(a != b)),
        eqx.filter(model.encoder, eqx.is_array),
        eqx.filter(pretrained.encoder, eqx.is_array),
    )
    assert any(jax.tree.leaves(moved))


def test_listops_records_fit_the_length(pretrained, capsys):
    """Every fine-tuning expression fits `length` with <cls> and <sep> (a cut one's label
    is noise: at length 16, 28% were cut, at --length 5 all); a length that not even the
    shortest expression fits is a usage error."""
    tok = ls.ByteTokenizer()
    for length in (16, 64):
        records = _bigs_train.listops_records(300, seed=0, tok=tok, length=length)
        assert len(records) == 300
        assert max(len(tok.encode(r["text"])) for r in records) <= length - 2
    with pytest.raises(ValueError, match=r"needs length >= 11, got length=10$"):
        _bigs_train.listops_records(10, seed=0, tok=tok, length=10)
    out, _, _ = pretrained
    argv = ["finetune", "--checkpoint", str(out), "--task", "listops", "--length", "5"]
    err = _cli_error(argv, capsys)
    assert "--length 5: the shortest ListOps expression takes 9 tokens" in err, err


def test_finetune_resumes_its_own_run_only(pretrained, tmp_path, capsys, monkeypatch):
    """A stopped `finetune` continues from its checkpoints when its command is run again,
    to the same model; a finished run's --out, or a stopped run's with other options, is
    refused (a rerun replaced final/ and left two runs' files mixed in the directory). A
    finished run keeps no checkpoints; one stopped before its first starts afresh."""
    out, _, _ = pretrained
    argv = [
        "finetune", "--checkpoint", str(out), "--task", "listops", "--listops-examples", "40",
        "--steps", "4", "--batch-size", "4", "--length", "16",
    ]  # fmt: skip
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    metrics = _bigs.finetune(_parse([*argv, "--out", str(whole)]))
    assert not (whole / "checkpoints").exists()  # only a stopped run resumes
    err = _cli_error([*argv, "--out", str(whole)], capsys)
    assert err.endswith(
        f"--out {whole}: holds a finished fine-tuning run; choose another directory"
    )
    # The run as if stopped after its second step's checkpoint.
    with monkeypatch.context() as patched:
        patched.setattr(_bigs, "shutil", argparse.Namespace(rmtree=lambda *a, **k: None))
        _bigs.finetune(_parse([*argv, "--out", str(stopped)]))
    (stopped / "result.json").unlink()
    shutil.rmtree(stopped / "final")
    for checkpoint in ls.list_checkpoints(stopped):
        if checkpoint.name != "step_00000002":
            shutil.rmtree(checkpoint)
    other = [*argv, "--lr", "0.01", "--out", str(stopped)]
    err = _cli_error(other, capsys)
    assert "an unfinished fine-tuning run with other options (--lr 0.01 (recorded: 0.0003))" in err
    assert _bigs.finetune(_parse([*argv, "--out", str(stopped)])) == pytest.approx(metrics)
    assert f"resumed the unfinished run in {stopped} at step 2" in capsys.readouterr().out
    model = _bigs_train.load_finetuned(stopped)[0]
    expected = _bigs_train.load_finetuned(whole)[0]
    assert jax.tree.all(jax.tree.map(jnp.array_equal, model, expected))
    # Stopped before its first checkpoint: nothing to resume, other options start afresh.
    (stopped / "result.json").unlink()
    shutil.rmtree(stopped / "final")
    with pytest.warns(UserWarning, match="holds metrics but no checkpoint: starting from step 0"):
        assert _bigs.finetune(_parse(other)) != pytest.approx(metrics)
    assert json.loads((stopped / "finetune.json").read_text())["lr"] == 0.01


# ----------------------------------------------------------------- CLI: inputs checked first


def _cli_error(argv, capsys) -> str:
    from lineax_seq.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["bigs", *argv])
    assert exit_info.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


def test_pretrain_skips_its_own_out_inside_the_corpus(pretrained, corpus_dir, tmp_path):
    """`--corpus .` with the default `--out outputs/...` below it: the run's own files
    (metrics.jsonl) were read as corpus documents, so its --resume was refused."""
    _, argv, _ = pretrained
    project = tmp_path / "project"
    shutil.copytree(corpus_dir, project)
    out = project / "outputs" / "run"
    run = [*argv[: argv.index("--out")], "--out", str(out), "--corpus", str(project)]
    run[run.index("--steps") + 1] = "1"
    _bigs.pretrain(_parse(run))
    assert (out / "metrics.jsonl").exists()
    run[run.index("--steps") + 1] = "2"
    assert np.isfinite(_bigs.pretrain(_parse([*run, "--resume"]))["loss"])
    assert ls.list_checkpoints(out / "final")[-1].name.endswith("2")


def test_pretrain_checks_the_batches_before_writing(pretrained, corpus_dir, tmp_path, capsys):
    """A corpus too small for --batch-size was a traceback after config.json was written,
    which then blocked the corrected command."""
    _, argv, _ = pretrained
    argv = [*argv[: argv.index("--out")], "--out", str(tmp_path / "r")]
    err = _cli_error([*argv, "--corpus", str(corpus_dir), "--batch-size", "5000"], capsys)
    assert err.startswith("python -m lineax_seq bigs pretrain: error: --corpus")
    assert "examples available" in err and "--batch-size" in err
    assert not (tmp_path / "r").exists()
    # Model options the encoder cannot take are named by option (building the model is
    # not wrapped as "reading inputs": an error there is a bug and keeps its traceback).
    attention = [*argv, "--routing", "attention", "--heads", "3"]
    assert _cli_error(attention, capsys).endswith(
        "--heads 3: must divide --dim 16 (attention routing)"
    )
    assert "--state-size 5: must be even" in _cli_error([*argv, "--state-size", "5"], capsys)


def test_pretrain_run_that_never_started(pretrained, tmp_path, capsys):
    """A run directory with a config but no checkpoint: a new command into it is refused
    with the way out, and its --resume is the same run as a fresh start (the MLM head's
    key was jr.key(1)); another command's files or a damaged config are usage errors."""
    out, argv, metrics = pretrained
    at = argv.index("--out") + 1
    into = lambda d, *extra: [*argv[:at], str(d), *argv[at + 1 :], *extra]  # noqa: E731
    record = json.loads((out / "config.json").read_text())
    record.pop("resumed", None)  # another test may have resumed the fixture's run
    unstarted = tmp_path / "unstarted"
    unstarted.mkdir()
    (unstarted / "config.json").write_text(json.dumps(record))
    err = _cli_error(into(unstarted), capsys)
    assert "stopped before its first checkpoint: pass --resume" in err, err
    # A bare --resume takes the recorded data and optimiser options (steps, length,
    # corpus files, batch size, seed, ...), not the parser's defaults.
    bare = ["pretrain", "--resume", "--out", str(unstarted)]
    assert _bigs.pretrain(_parse(bare)) == pytest.approx(metrics)
    config = json.loads((unstarted / "config.json").read_text())
    assert config["pretrain"]["out"] == str(out)  # the original record is kept
    assert [r["resume"] for r in config["resumed"]] == [True]
    assert "dim" not in config["resumed"][0]  # the checkpoint's model, not parser defaults
    assert config["resumed"][0]["steps"] == config["pretrain"]["steps"] == 3
    # Another command's files are never overwritten by a new run (a fine-tuning run's
    # final/ was replaced), nor is a pretraining run by `finetune --out`.
    other = tmp_path / "other"
    other.mkdir()
    (other / "result.json").write_text("{}")
    err = _cli_error(into(other), capsys)
    assert "holds another run's files (result.json)" in err, err
    ft = ["finetune", "--checkpoint", str(out), "--task", "listops", "--out", str(out)]
    assert "holds a `bigs pretrain` run" in _cli_error(ft, capsys)
    for damaged in ("{", "{}"):
        (unstarted / "config.json").write_text(damaged)
        err = _cli_error(into(unstarted, "--resume"), capsys)
        assert f"--resume {unstarted}" in err, err


def test_resume_takes_options_given_at_their_defaults(pretrained, capsys):
    """An option given on a --resume overrides the record even at its parser default
    (`--length 128`, `--seed 0`: they were taken as left out, and the recorded 32 ran)."""
    out, _, _ = pretrained
    recorded = json.loads((out / "config.json").read_text())
    run = (recorded.get("resumed") or [recorded["pretrain"]])[-1]
    assert (run["length"], run["max_files"]) == (32, 12)
    given = ["pretrain", "--resume", "--out", str(out), "--length", "128", "--seed", "0"]
    args = _bigs._resume_options(_parse(given))
    assert (args.length, args.seed, args.max_files) == (128, 0, 12)  # the rest recorded
    assert "--length 128 (recorded: 32)" in capsys.readouterr().out
    assert _bigs._resume_options(_parse(given[:4])).length == 32


def test_resume_compares_paths_as_recorded(tmp_path, monkeypatch):
    """A corpus given again by a relative path is the recorded (absolute) one: no note of
    a changed option; another file is one."""
    monkeypatch.chdir(tmp_path)
    recorded = {"corpus": str(tmp_path / "data" / "c.txt")}
    for given, changed in (("data/c.txt", []), ("data/d.txt", ["--corpus data/d.txt"])):
        args = argparse.Namespace(corpus=pathlib.Path(given), **{_bigs._GIVEN: ("corpus",)})
        _, taken, notes = _bigs._with_recorded(args, recorded, ("corpus",))
        assert taken == [] and [n.split(" (recorded")[0] for n in notes] == changed


def test_resume_and_init_from_keep_the_runs_packing(pretrained, tmp_path, capsys):
    out, _, _ = pretrained
    config = json.loads((out / "config.json").read_text())
    config.pop("resumed", None)
    # A run recorded before --pack existed ran unpacked: --pack changes it, and says so.
    del config["pretrain"]["pack"]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    resume = ["pretrain", "--resume", "--out", str(tmp_path / "old")]
    assert not _bigs._resume_options(_parse(resume)).pack
    assert _bigs._resume_options(_parse([*resume, "--pack"])).pack
    assert "--pack (recorded: --no-pack)" in capsys.readouterr().out
    # Continuing a packed run packs too, unless told otherwise.
    config["pretrain"]["pack"] = True
    (tmp_path / "packed").mkdir()
    (tmp_path / "packed" / "config.json").write_text(json.dumps(config))
    init = ["pretrain", "--init-from", str(tmp_path / "packed"), "--out", str(tmp_path / "x")]
    assert _bigs._init_from_corpus(_parse(init)).pack
    assert "pretraining on its corpus (--max-files 12, --pack)" in capsys.readouterr().out
    assert not _bigs._init_from_corpus(_parse([*init, "--no-pack"])).pack


def test_finetune_refuses_checkpoints_it_cannot_resume(pretrained, tmp_path, capsys):
    """A fine-tuning --out holding another model's checkpoints (a pretraining run's,
    without its config.json) is a usage error, not a CheckpointError traceback; so is a
    --checkpoint whose config.json has no model (a KeyError)."""
    out, _, _ = pretrained
    shutil.copytree(out / "checkpoints", tmp_path / "other" / "checkpoints")
    ft = ["finetune", "--checkpoint", str(out), "--task", "listops", "--steps", "1",
          "--batch-size", "2", "--length", "16", "--listops-examples", "20"]  # fmt: skip
    err = _cli_error([*ft, "--out", str(tmp_path / "other")], capsys)
    assert "holds checkpoints this fine-tuning run cannot resume" in err, err
    shutil.copytree(out, tmp_path / "nomodel", ignore=shutil.ignore_patterns("checkpoints"))
    (tmp_path / "nomodel" / "config.json").write_text('{"tokenizer": "byte"}')
    ft[ft.index("--checkpoint") + 1] = str(tmp_path / "nomodel")
    err = _cli_error([*ft, "--out", str(tmp_path / "ft")], capsys)
    assert "config.json has no model and tokenizer entries" in err, err


def test_init_from_records_its_source_not_its_history(pretrained, tmp_path, monkeypatch):
    """A run started from another's weights records that run's absolute path (so it
    loads from anywhere) and not that run's own resumes."""
    out, argv, _ = pretrained
    source = json.loads((out / "config.json").read_text())
    monkeypatch.chdir(out.parent)
    at = argv.index("--out")
    new = tmp_path / "continued"
    _bigs.pretrain(_parse([*argv[:at], "--out", str(new), "--init-from", out.name, "--steps", "1"]))
    config = json.loads((new / "config.json").read_text())
    assert config["init_from"] == str(out) and "resumed" not in config
    assert config["model"] == source["model"]


def test_unfinished_run_is_refused_with_a_way_out(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "checkpoints").mkdir()
    for argv in (
        ["finetune", "--checkpoint", str(tmp_path), "--task", "listops"],
        ["kernels", "--checkpoint", str(tmp_path)],
        ["pretrain", "--init-from", str(tmp_path), "--out", str(tmp_path / "x")],
    ):
        err = _cli_error(argv, capsys)
        assert "the run has not finished" in err, err
        assert f"bigs pretrain --resume --out {tmp_path}" in err


def test_finetune_input_errors_are_usage_errors(pretrained, tmp_path, capsys):
    out, _, _ = pretrained
    files = {
        "empty.csv": b"",
        "header.csv": b"text,label\n",
        "nolabel.csv": b"text,x\na,1\nb,0\n",
        "one.csv": b"text,label\na,x\nb,x\n",
        "binary.csv": b"text,label\n\xff\xfe\x00a,1\n",
        "tiny.csv": b"text,label\na,1\nb,0\nc,1\n",
        "nan.csv": b"text,label\na,0.1\nb,0.2\nc,nan\nd,0.4\n",
        "spaced.csv": b"text, label\na, 1\nb, 0\n",
        "ones.csv": b"text,label\na,1\nb,1\nc,1\n",
        "ints.csv": b"text,label\na,1\nb,0\nc,1\nd,0\n",
        "three.csv": b"text,label\na,2\n",
        "named.csv": b"text,label\na,pos\n",
        "pairs.csv": b"text,text_pair,label\na,b,1\n",
        "row.csv": b"text,label\na,1\nb,0\n",
        "list.jsonl": b'{"text": "a", "label": [1]}\n',
        "null.jsonl": b'{"text": "a", "label": null}\n',
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "dir").mkdir()
    ft = ["finetune", "--checkpoint", str(out), "--batch-size", "2", "--out", str(tmp_path / "o")]
    for extra, message in (
        (["--train", "{t}/empty.csv"], r"--train .*empty.csv: .*no examples"),
        (["--train", "{t}/header.csv"], r"--train .*header.csv: .*no examples"),
        (["--train", "{t}/nolabel.csv"], r"--train .*nolabel.csv: .*label"),
        (["--train", "{t}/one.csv"], r"every label is 'x'"),
        (["--train", "{t}/binary.csv"], r"--train .*binary.csv: not UTF-8 text"),
        (["--train", "{t}/dir"], r"--train .*dir: "),
        (["--train", "{t}/tiny.csv", "--batch-size", "4"], r"--batch-size 4: --train gives only"),
        (["--train", "{t}/nan.csv"], r"numbers but for \['nan'\].* --regression"),
        (["--train", "{t}/spaced.csv"], r"missing field 'label'; its fields are 'text', ' label'"),
        (["--train", "{t}/ones.csv"], r"ones.csv: every label is 1; a class task needs two"),
        (["--train", "{t}/list.jsonl"], r"list.jsonl:1: label \[1\] is not a class id"),
        (["--train", "{t}/null.jsonl"], r"null.jsonl:1: label null is not a class id"),
        (
            ["--train", "{t}/row.csv", "--batch-size", "1"],
            r"row.csv: its 2 example\(s\) leave none held",
        ),
        (
            ["--train", "{t}/ints.csv", "--eval", "{t}/three.csv"],
            r"--eval .*three.csv: .*label '2' is outside the class range \[0, 2\)",
        ),
        (["--train", "{t}/ints.csv", "--eval", "{t}/named.csv"], r"use one kind of label"),
        (
            ["--train", "{t}/ints.csv", "--eval", "{t}/pairs.csv"],
            r"--eval .*pairs.csv has sentence pairs but --train .*ints.csv has single texts",
        ),
        (["--train", "{t}/tiny.csv", "--length", "2"], r"--length 2: an example needs at least"),
        (["--task", "listops", "--train", "{t}/tiny.csv"], r"--task listops: --train applies to"),
        (["--task", "listops", "--regression"], r"--task listops: --regression applies to"),
        (
            ["--task", "listops", "--train", "{t}/tiny.csv", "--regression"],
            r"--task listops: --train and --regression apply to --task file only",
        ),
        # Options of the other task: refused, not ignored (even at their defaults).
        (["--task", "listops", "--truncation", "end"], r"--task listops: --truncation applies"),
        (
            ["--train", "{t}/tiny.csv", "--listops-examples", "4000"],
            r"--task file: --listops-examples applies to --task listops only",
        ),
    ):
        argv = [*ft, *(a.format(t=tmp_path) for a in extra)]
        err = _cli_error(argv, capsys)
        assert err.startswith("python -m lineax_seq bigs finetune: error: "), err
        assert re.search(message, err), (message, err)
    assert not (tmp_path / "o").exists()


def test_finetune_notes_pairs_without_segment_embeddings(pretrained, tmp_path, capsys):
    """`bigs pretrain` builds no token-type embeddings: a pair file says how its two texts
    are told apart (the batches' token_types reach only an encoder that has them)."""
    out, _, _ = pretrained
    pairs = [(f"a{i}", f"b{i}", i % 2) for i in range(20)]
    for rows, noted in ((pairs, True), ([(a, c) for a, _, c in pairs], False)):
        path = write_rows(rows, tmp_path / "p.csv")
        argv = ["finetune", "--checkpoint", str(out), "--train", str(path), "--batch-size", "2"]
        _bigs._finetune_inputs(_parse(argv))
        printed = capsys.readouterr().out
        assert ("sentence pairs, and the encoder has no token-type" in printed) == noted


def test_finetune_notes_unused_class_ids(pretrained, tmp_path, capsys):
    """Labels counted from 1 gave an untrained class 0 without a word."""
    out, _, _ = pretrained
    path = write_rows([(f"t{i}", 1 + i % 3) for i in range(20)], tmp_path / "a.csv")
    argv = ["finetune", "--checkpoint", str(out), "--train", str(path), "--batch-size", "2"]
    *_, (_, _, outputs, names) = _bigs._finetune_inputs(_parse(argv))
    assert (outputs, names) == (4, None)
    assert "class id(s) [0] never occur among the labels 0 .. 3" in capsys.readouterr().out


def test_run_records_absolute_paths_and_notes_left_out_documents(tmp_path, monkeypatch, capsys):
    """A relative --corpus was recorded as given, so a --resume from another directory
    read another corpus; a JSONL corpus lost documents to --max-files silently."""
    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(300)))
    args = _parse(["pretrain", "--corpus", "c.jsonl", "--out", "run", "--max-files", "50"])
    settings = _bigs._settings(args, from_checkpoint=False)
    assert settings["corpus"] == str(corpus) and settings["out"] == str(tmp_path / "run")
    train, _ = _bigs_train.load_corpus(args.corpus, args.max_files)
    assert len(train) == 50
    assert "training on 50 of the corpus's" in capsys.readouterr().out
    corpus.write_text(json.dumps({"text": "only one"}) + "\n")
    err = _cli_error(["pretrain", "--corpus", str(corpus), "--out", "r2"], capsys)
    assert "JSONL lines go to the held-out split" in err and "more files" not in err


def test_kernels_writes_and_prints_the_png(pretrained, tmp_path, capsys):
    out, _, _ = pretrained
    argv = ["kernels", "--checkpoint", str(out), "--out", str(tmp_path / "k")]
    path = _bigs.kernels(_parse(argv))
    assert path == tmp_path / "k.png" and path.is_file()
    assert f"kernel heat map: {path}" in capsys.readouterr().out
    err = _cli_error(["kernels", "--checkpoint", str(out), str(out)], capsys)
    assert "given twice" in err


def test_ablation_names_cover_every_setting():
    """Most settings (--dim, --length, --corpus, --quick's seed and task...) left the name
    bigs_ablation(.json), overwriting the committed default run's results."""

    def name(*argv):
        args = _parse(["ablation", *argv])
        cfg = {k: getattr(args, k) for k in _bigs_ablation.SETTINGS}
        others = _bigs_ablation._other_settings(args)
        return _bigs_ablation.output_suffix(cfg, quick=args.quick, backend="cpu", others=others)

    assert name() == ""
    assert name("--finetune-task", "match", "--finetune-steps", "1500", "--seed", "1") == (
        "_match_1500ftsteps_seed1"
    )
    assert name("--quick") == "_quick" and name("--quick", "--dim", "8") == "_quick"
    # Settings as the run uses them: --quick caps --max-files at 40 (a smaller one is
    # another run), and --init-std's default for --dim given explicitly is the default.
    assert name("--quick", "--max-files", "10") not in ("_quick", name("--quick", "--seed", "1"))
    assert name("--quick", "--max-files", "400") == "_quick"
    assert name("--init-std", f"{_bigs_train.scaled_init_std(64)!r}") == ""
    names = [
        name(*a)
        for a in (
            ["--dim", "32"],
            ["--length", "256", "--batch-size", "8"],
            ["--corpus", "."],
            ["--lr", "3e-3"],
            ["--tokenizer", "bpe"],
            ["--quick", "--seed", "1"],
            ["--quick", "--finetune-task", "match"],
        )
    ]
    assert len(set(names)) == len(names) and "" not in names and "_quick" not in names
