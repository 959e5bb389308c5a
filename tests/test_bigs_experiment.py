"""Behaviour of the `python -m lineax_seq bigs ...` pieces at tiny size."""

import argparse
import csv
import json

import numpy as np
import pytest

from lineax_seq.experiments import _bigs

TEXTS = [
    "def alpha(x):\n    return x + 1\n" * 6,
    "class Beta:\n    value = 2\n" * 6,
    "import os\nprint(os.sep)\n" * 6,
    "short",
]


# ----------------------------------------------------------------- continuation task


def test_continuation_rows_positive_is_true_continuation():
    rows = _bigs.continuation_rows(TEXTS, num_rows=40, chars=20, seed=3)
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
    a = _bigs.continuation_rows(TEXTS, num_rows=10, chars=10, seed=0)
    b = _bigs.continuation_rows(TEXTS, num_rows=10, chars=10, seed=0)
    c = _bigs.continuation_rows(TEXTS, num_rows=10, chars=10, seed=1)
    assert a == b
    assert a != c


def test_continuation_rows_bad_input():
    with pytest.raises(ValueError, match="chars"):
        _bigs.continuation_rows(TEXTS, num_rows=2, chars=0)
    with pytest.raises(ValueError, match="at least 2 documents"):
        _bigs.continuation_rows(TEXTS, num_rows=2, chars=1000)


def test_write_rows_csv_roundtrip(tmp_path):
    rows = [("a,b\nc", 1), ('say "hi"', 0)]
    path = _bigs.write_rows(rows, tmp_path / "sub" / "task.csv")
    with path.open(newline="") as f:
        read = list(csv.DictReader(f))
    assert [(r["text"], int(r["label"])) for r in read] == rows
    pairs = [("a", "b", 1), ("c", "d", 0)]
    path = _bigs.write_rows(pairs, tmp_path / "pairs.csv")
    with path.open(newline="") as f:
        read = list(csv.DictReader(f))
    assert [(r["text"], r["text_pair"], int(r["label"])) for r in read] == pairs


# ----------------------------------------------------------------- baselines


def test_unigram_baseline_matches_entropy():
    train = np.array([0, 0, 0, 1, 1, 2])
    loss, acc = _bigs.unigram_baseline(train, train, vocab_size=4)
    counts = np.array([4.0, 3.0, 2.0, 1.0])  # add-one smoothed
    p = counts / counts.sum()
    expected = -(3 * np.log(p[0]) + 2 * np.log(p[1]) + np.log(p[2])) / 6
    assert loss == pytest.approx(expected)
    assert acc == pytest.approx(0.5)
    with pytest.raises(ValueError, match="targets"):
        _bigs.unigram_baseline(train, np.array([], int), vocab_size=4)


# ----------------------------------------------------------------- kernels (Figure 3)


def test_kernel_image_layout_and_scaling():
    length, layers, r = 16, 3, 4
    fwd = np.arange(layers * length, dtype=float).reshape(layers, length) + 1
    bwd = -10 * fwd
    image = _bigs.kernel_image(fwd, bwd, radius=r)
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
        _bigs.kernel_image(stacked, stacked, radius=r), _bigs.kernel_image(fwd, fwd, radius=r)
    )


def test_kernel_image_bad_input():
    with pytest.raises(ValueError, match="too short"):
        _bigs.kernel_image(np.ones((2, 5)), np.ones((2, 5)), radius=10)
    with pytest.raises(ValueError, match="must both have shape"):
        _bigs.kernel_image(np.ones((2, 20)), np.ones((3, 20)))


def test_plot_kernels_and_ablation_files(tmp_path):
    k = np.random.default_rng(0).normal(size=(2, 32))
    png = _bigs.plot_kernels({"a": (k, k), "b": (k[:1], k[:1])}, tmp_path / "k.png")
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
            "mlm_curve": _bigs.smooth_curve([5.0, 4.0, 3.0], points=2),
        }
        for i, name in enumerate(["x", "y"])
    ]
    assert _bigs.plot_ablation(results, tmp_path / "a.png").stat().st_size > 0
    table = _bigs.ablation_table(results)
    assert table.count("\n") == 3 and "| x | 1,000 (500) | 4,096 | 3.000" in table
    json.dumps(results)


def test_smooth_curve():
    assert _bigs.smooth_curve([]) == []
    assert _bigs.smooth_curve([1.0, 3.0, 5.0, 7.0], points=2) == [[2.0, 2.0], [4.0, 6.0]]


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
