"""`python -m lineax_seq bst` at tiny size: it trains, evaluates, and writes its outputs."""

import argparse
import dataclasses
import json
import re

import equinox as eqx
import jax.random as jr
import numpy as np
import pytest

import lineax_seq as ls
from lineax_seq.__main__ import main
from lineax_seq.experiments import _bst


def _run(seed: int, perplexity: dict[str, float]) -> dict:
    """One seed's record, as `_train_and_evaluate` writes it."""
    return {
        "seed": seed,
        "train_seconds": 1.0,
        "eval_seconds": 0.5,
        "final_train_loss": 2.0,
        "train_loss": [3.0, 2.0],
        "train_loss_steps": [5, 10],
        "perplexity": perplexity,
    }


def _payload(bst_ppl: list[float], bst_ppl_16l: float) -> dict:
    """Two models over len(bst_ppl) seeds; SLIDE at 5.0 everywhere."""

    def result(at_l: list[float], at_16l: float) -> dict:
        runs = [_run(seed, {"512": p, "1024": p, "16384": at_16l}) for seed, p in enumerate(at_l)]
        return _bst._aggregate(1000, 64, runs)

    seeds = list(range(len(bst_ppl)))
    return {
        "config": {"train_length": 1024, "window": 128, "seeds": seeds},
        "eval_lengths": [512, 1024, 16384],
        "results": {
            "SLIDE": result([5.0] * len(seeds), 5.0),
            "BST:SH:S4": result(bst_ppl, bst_ppl_16l),
        },
    }


def test_summary_goals():
    good = _bst.summarise(_payload([4.0], 4.1))
    assert "BST:SH:S4 beats SLIDE at L" in good["lines"][0]
    assert "is within 5%" in good["lines"][1]
    bad = _bst.summarise(_payload([6.0], 7.0))
    assert "does NOT beat" in bad["lines"][0]
    assert "NOT within" in bad["lines"][1]
    # The 5% bound: 4.19 / 4 - 1 = 4.75% is within, 4.25 / 4 - 1 = 6.25% is not.
    assert "is within 5%" in _bst.summarise(_payload([4.0], 4.19))["lines"][1]
    assert "NOT within" in _bst.summarise(_payload([4.0], 4.25))["lines"][1]
    rows = _bst.table(_payload([4.0], 4.1)).splitlines()
    assert len(rows) == 4 and "ppl @ 1024 (L)" in rows[0] and "±" not in rows[3]


def test_default_evaluation_lengths_are_the_papers():
    """Fig. 2.3's study: L / 2, L, 4 L and 16 L."""
    cfg = _bst.Config()
    n = cfg.train_length
    assert cfg.eval_lengths() == [n // 2, n, 4 * n, 16 * n]


def test_perplexity_is_exp_of_the_nll_at_each_length(monkeypatch):
    """Each length is evaluated at that length, and reported as exp(mean NLL)."""
    cfg = dataclasses.replace(_bst.small_config(), eval_multipliers=(0.5, 1.0))
    n = cfg.train_length
    nll = {n // 2: 1.0, n: 2.0}
    monkeypatch.setattr(_bst, "train_lm", lambda model, *a, **k: (model, [1.0] * 4, [1, 2, 3, 4]))
    monkeypatch.setattr(_bst, "evaluate_lm", lambda model, heldout, length: nll[length])
    got = _bst._train_and_evaluate("SLIDE", None, None, None, cfg, 0)["perplexity"]
    assert got == pytest.approx({str(n // 2): np.e, str(n): np.e**2})


def test_matched_widths_bring_every_model_to_the_largest():
    """Parameter matching grows the smaller models' MLPs toward the largest model."""
    cfg = _bst.small_config()
    widths = _bst.matched_mlp_dims(300, cfg)
    base = 4 * cfg.dim
    assert set(widths) == set(cfg.models) and min(widths.values()) >= base
    assert max(widths.values()) > base  # someone was smaller than the largest


def test_summary_over_seeds_is_the_mean_and_paired():
    # seeds: 4.0 (better than SLIDE's 5.0), 5.5 (worse), 4.5 (better): mean 4.667
    payload = _payload([4.0, 5.5, 4.5], 4.7)
    summary = _bst.summarise(payload)
    np.testing.assert_allclose(summary["BST:SH:S4 vs SLIDE at L"], 1 - 14 / 15)
    np.testing.assert_allclose(summary["BST:SH:S4 vs SLIDE at L, per seed"], [0.2, -0.1, 0.1])
    assert "better in 2 of 3" in summary["lines"][0]
    bst = payload["results"]["BST:SH:S4"]
    np.testing.assert_allclose(bst["perplexity_std"]["1024"], np.std([4.0, 5.5, 4.5]))
    assert "4.667 ± 0.62" in _bst.table(payload).splitlines()[3]


def test_diverged_seed_is_left_out_of_the_mean():
    runs = [_run(0, {"1024": 4.0}), {"seed": 1, "error": "nan at step 3"}]
    entry = _bst._aggregate(1000, 64, runs)
    assert entry["perplexity"] == {"1024": 4.0} and len(entry["runs"]) == 2
    failed = _bst._aggregate(1000, 64, runs[1:])
    assert "perplexity" not in failed and "nan at step 3" in failed["error"]


def test_flags_override_small_defaults():
    parser = argparse.ArgumentParser()
    _bst.add_arguments(parser)
    cfg = _bst.config_from_args(parser.parse_args(["--small", "--steps", "3", "--lr", "0.01"]))
    assert (cfg.steps, cfg.learning_rate, cfg.dim) == (3, 0.01, _bst.small_config().dim)
    cfg = _bst.config_from_args(parser.parse_args(["--models", "SLIDE", "--bst-layers", "0", "2"]))
    assert (cfg.models, cfg.bst_layers, cfg.steps) == (("SLIDE",), (0, 2), _bst.Config().steps)
    assert cfg.seeds == _bst.Config().seeds and _bst.small_config().seeds == (0,)
    cfg = _bst.config_from_args(parser.parse_args(["--small", "--seeds", "3", "4"]))
    assert cfg.seeds == (3, 4)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "'0' is not a positive integer"),
        (["--eval-multipliers", "1", "0"], "'0' is not a positive finite number"),
        (["--eval-tokens", "0"], "'0' is not a positive integer"),
        (["--lr", "nan"], "'nan' is not a positive finite number"),
        (["--warmup-steps", "-1"], "'-1' is not a non-negative integer"),
    ],
)
def test_bad_flags(argv, message, capsys):
    parser = argparse.ArgumentParser()
    _bst.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(argv)
    assert message in capsys.readouterr().err


def test_s4_step_sizes_follow_the_training_length():
    """The slowest S4D mode's time constant 2 / dt_min is half the training length."""
    cfg = _bst.small_config()  # train_length 256
    assert cfg.dt_min is None and cfg.ssm_dt_min() == 4 / 256
    assert _bst.Config(train_length=32).ssm_dt_min() == 0.05  # capped at dt_max / 2
    parser = argparse.ArgumentParser()
    _bst.add_arguments(parser)
    assert _bst.config_from_args(parser.parse_args(["--dt-min", "0.002"])).ssm_dt_min() == 0.002
    lm = _bst.build_lm("BST:SH:S4", 256, cfg, mlp_dim=64, key=jr.key(0))
    (kernel,) = [layer.ssm.kernel for layer in lm.layers if hasattr(layer, "ssm")]
    dt = np.exp(np.asarray(kernel.log_dt))
    assert dt.min() >= (4 / 256) * (1 - 1e-6) and dt.max() <= cfg.dt_max * (1 + 1e-6)


def test_bad_model_name():
    with pytest.raises(ValueError, match="model must be one of"):
        _bst.build_lm("BST:XX:S4", 256, _bst.small_config(), mlp_dim=64, key=jr.key(0))


@pytest.mark.slow
def test_cli_tiny_run(tmp_path):
    rc = main(
        ["bst", "--small", "--models", "SLIDE", "BST:SH:S4", "--steps", "7", "--out", str(tmp_path)]
    )
    assert rc == 0
    stem = _bst.output_stem(dataclasses.replace(_bst.small_config(), steps=7,
                                                models=("SLIDE", "BST:SH:S4")), None)  # fmt: skip
    assert stem.startswith("bst_lm_7steps_")  # not the committed bst_lm.*
    payload = json.loads((tmp_path / f"{stem}.json").read_text())
    assert set(payload["results"]) == {"SLIDE", "BST:SH:S4"}
    assert payload["config"]["steps"] == 7  # the explicit flag wins over --small's 20
    assert payload["config"]["dt_min"] == 4 / 256  # the value used, not None
    for r in payload["results"].values():
        # one record per LOG_EVERY = 5 steps, plus the final partial window (steps 6-7)
        assert r["train_loss_steps"] == [5, 7] and len(r["train_loss"]) == 2
        assert all(1.0 < p < 1e4 for p in r["perplexity"].values())
    sizes = [r["parameters"] for r in payload["results"].values()]
    assert max(sizes) / min(sizes) < 1.05, "parameter counts should be matched"
    assert (tmp_path / f"{stem}.png").stat().st_size > 0
    assert (tmp_path / f"{stem}.md").read_text().startswith("| model")


def test_cli_corpus_errors(tmp_path, capsys):
    """A missing --corpus is a usage error; a book too short for the held-out windows is
    one line naming --corpus (it was a traceback)."""
    from lineax_seq.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["bst", "--small", "--corpus", str(tmp_path / "missing")])
    assert exit_info.value.code == 2 and "does not exist" in capsys.readouterr().err
    book = tmp_path / "book.txt"
    book.write_text("a short line of text\n" * 300)
    with pytest.raises(SystemExit) as exit_info:
        main(["bst", "--small", "--corpus", str(book), "--out", str(tmp_path / "out")])
    message = capsys.readouterr().err.splitlines()[-1]
    assert exit_info.value.code == 2
    assert message == (
        f"python -m lineax_seq bst: error: --corpus '{book}': the held-out (valid) split has "
        "no document of max(--eval-multipliers) x --train-length + 1 = 1025 tokens (its "
        "longest has 317); use a smaller --train-length or --eval-multipliers, or more text"
    )
    # The train split's documents too short for --train-length: named by that option.
    cfg = _bst.Config(train_length=8192, window=128)
    with pytest.raises(ValueError, match=r"the train split has no document of --train-length "
                       r"\+ 1 = 8193 tokens \(its longest has \d+\); use a smaller"):  # fmt: skip
        _bst.train_batches(str(book), ls.ByteTokenizer(), cfg, seed=0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--eval-multipliers", "1", "1.5"],
            r"--eval-multipliers 1 1.5: 1 x .* = 256 must be .* longest evaluation length 384",
        ),
        (["--eval-multipliers", "0.5", "1", "--train-length", "192"], "= 96 must be a multiple"),
        (["--eval-multipliers", "2"], "--eval-multipliers 2: must include 1"),
        (["--train-length", "100"], "--window 64: must divide --train-length 100"),
        (["--heads", "3"], "--heads 3: must divide --dim 32"),
        (["--bst-layers", "5"], "--bst-layers 5: layer indices must be below --layers 2"),
        (["--dt-min", "0.5", "--dt-max", "0.1"], "--dt-min 0.5: must be below --dt-max 0.1"),
        (["--models", "SLIDE", "SLIDE"], "--models SLIDE SLIDE: each may be given once"),
        (["--seeds", "0", "0"], "--seeds 0 0: each may be given once"),
        # A PRNG key holds 32 bits of a seed: 2**32 was seed 0 again, 2**63 a traceback.
        (["--seeds", str(2**32)], "'4294967296' is not a seed"),
        (["--corpus", ""], "'' is not a path"),  # it read the current directory
        (["--out", ""], "'' is not a path"),  # it wrote into the current directory
        (["--eval-multipliers", "1", "1e308"], r"1e\+308 x .* = inf must be a whole number"),
        (["--eval-multipliers", "1", "0.2501"], r"= 64.0256 must be a whole number of tokens"),
        (["--out", "{tmp}/file"], "--out .*file: exists and is not a directory"),
        (["--out", "{tmp}/file/x"], "--out .*x: .*file is a file, not a directory"),
    ],
)
def test_cli_usage_errors_before_training(argv, message, tmp_path, capsys):
    """Each was a traceback, several of them after the whole training."""
    from lineax_seq.__main__ import main

    (tmp_path / "file").touch()
    argv = [a.format(tmp=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(["bst", "--small", "--models", "SLIDE", "--eval-tokens", "512", *argv])
    err = capsys.readouterr()
    assert exit_info.value.code == 2 and "training" not in err.out
    assert re.search(message, err.err.splitlines()[-1]), err.err


def test_cli_checks_its_output_files_before_training(tmp_path, capsys):
    """A result file that cannot be written (here a directory of its name) is a usage
    error before training (it was a traceback after it, the .json and .md written)."""
    from lineax_seq.__main__ import main

    argv = ["--small", "--models", "SLIDE", "--eval-tokens", "512", "--out", str(tmp_path)]
    parser = argparse.ArgumentParser()
    _bst.add_arguments(parser)
    stem = _bst.output_stem(_bst.config_from_args(parser.parse_args(argv)), None)
    (tmp_path / f"{stem}.png").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        main(["bst", *argv])
    err = capsys.readouterr()
    assert exit_info.value.code == 2 and "training" not in err.out
    assert f"{stem}.png: is a directory" in err.err.splitlines()[-1], err.err
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{stem}.png"]


def test_output_names_keep_the_default_and_documented_runs():
    name = lambda **kw: _bst.output_stem(dataclasses.replace(_bst.Config(), **kw), None)
    pair = ("SLIDE", "BST:SH:S4")
    assert name() == "bst_lm"
    assert name(steps=1200, models=pair) == "bst_lm_1200steps"
    assert name(dt_min=1e-3) == "bst_lm_dt_min_1e-3"
    assert name(steps=1200, models=pair, dt_min=1e-3) == "bst_lm_1200steps_dt_min_1e-3"
    others = {name(models=pair), name(seeds=(0,)), name(dim=64), name(steps=1200)}
    assert len(others) == 4 and not others & {"bst_lm", "bst_lm_1200steps"}
    assert _bst.output_stem(_bst.Config(), "corpus.txt") != "bst_lm"
    # Step-size bounds are told apart (1.4e-3 had the committed 1e-3 run's name), and the
    # default range given explicitly (4 / train_length) is the default run.
    assert name(dt_min=1.4e-3) == "bst_lm_dt_min_1.4e-3"
    assert name(dt_min=0.0099) == "bst_lm_dt_min_9.9e-3" and name(dt_min=0.05).endswith("_0.05")
    assert name(dt_min=4 / 1024) == "bst_lm"


def test_labels_follow_the_settings():
    payload = _payload([4.0], 4.1)
    payload["eval_lengths"] = [512, 1024, 4096]
    for r in payload["results"].values():
        r["perplexity"]["4096"] = r["perplexity"].pop("16384")
        r["train_loss_steps"] = [5, 7]
    assert "BST:SH:S4 ppl(4L)/ppl(L) - 1" in _bst.summarise(payload)
    assert "train loss (last 7 steps)" in _bst.table(payload)


def test_heldout_windows_spread_over_the_valid_split(tmp_path):
    # 400 numbered documents of one window each: the held-out windows must come from the
    # first, the middle and the last validation documents, not the first three.
    for i in range(400):
        (tmp_path / f"doc{i:03d}.txt").write_text(f"{i:03d}|" * 75)
    cfg = _bst.dataclasses.replace(
        _bst.small_config(), train_length=64, eval_multipliers=(1.0, 4.0), eval_tokens=3 * 256
    )
    tokenizer = ls.ByteTokenizer()
    heldout = _bst.heldout_windows(str(tmp_path), tokenizer, cfg)
    valid = [int(doc[:3]) for doc in ls.text_corpus(str(tmp_path), split="valid")]
    assert heldout.shape == (3, 257) and len(valid) > 6
    picked = [valid.index(int(tokenizer.decode(row[1:4].tolist()))) for row in heldout]
    assert picked[0] == 0 and picked[2] == len(valid) - 1
    assert abs(picked[1] - (len(valid) - 1) / 2) <= 0.5


def test_evaluate_equals_per_sequence_mean():
    cfg = _bst.small_config()
    model = _bst.build_lm("BST:SH:S4", 50, cfg, mlp_dim=64, key=jr.key(1))
    tokens = jr.randint(jr.key(2), (2, 4 * cfg.train_length + 1), 0, 50)
    length = cfg.train_length
    sequence_loss = eqx.filter_jit(_bst.sequence_loss)  # one compilation for every sequence
    expected = np.mean(
        [
            float(sequence_loss(model, row[s : s + length], row[s + 1 : s + length + 1]))
            for row in tokens
            for s in range(0, tokens.shape[1] - 1, length)
        ]
    )
    heldout = np.asarray(tokens)
    np.testing.assert_allclose(_bst.evaluate_lm(model, heldout, length), expected, rtol=1e-5)
    with pytest.raises(ValueError, match="must divide"):
        _bst.evaluate_lm(model, heldout, 3 * length)
