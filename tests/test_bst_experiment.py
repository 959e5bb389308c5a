"""`python -m lineax_seq bst` at tiny size: it trains, evaluates, and writes its outputs."""

import argparse
import json

import jax.random as jr
import pytest

from lineax_seq.__main__ import main
from lineax_seq.experiments import _bst


def _payload(ppl_l: float, ppl_16l: float) -> dict:
    results = {
        name: {
            "parameters": 1000,
            "train_seconds": 1.0,
            "perplexity": {"512": ppl_l, "1024": ppl_l, "16384": ppl_16l},
        }
        for name in ("SLIDE", "BST:SH:S4")
    }
    results["SLIDE"]["perplexity"] = {"512": 5.0, "1024": 5.0, "16384": 5.0}
    return {
        "config": {"train_length": 1024, "window": 128},
        "eval_lengths": [512, 1024, 16384],
        "results": results,
    }


def test_summary_goals():
    good = _bst.summarise(_payload(4.0, 4.1))
    assert "BST:SH:S4 beats SLIDE at L" in good["lines"][0]
    assert "is within 5%" in good["lines"][1]
    bad = _bst.summarise(_payload(6.0, 7.0))
    assert "does NOT beat" in bad["lines"][0]
    assert "NOT within" in bad["lines"][1]
    rows = _bst.table(_payload(4.0, 4.1)).splitlines()
    assert len(rows) == 4 and "ppl @ 1024 (L)" in rows[0]


def test_flags_override_small_defaults():
    parser = argparse.ArgumentParser()
    _bst.add_arguments(parser)
    cfg = _bst.config_from_args(parser.parse_args(["--small", "--steps", "3", "--lr", "0.01"]))
    assert (cfg.steps, cfg.learning_rate, cfg.dim) == (3, 0.01, _bst.small_config().dim)
    cfg = _bst.config_from_args(parser.parse_args(["--models", "SLIDE", "--bst-layers", "0", "2"]))
    assert (cfg.models, cfg.bst_layers, cfg.steps) == (("SLIDE",), (0, 2), _bst.Config().steps)


def test_bad_model_name():
    with pytest.raises(ValueError, match="model must be one of"):
        _bst.build_lm("BST:XX:S4", 256, _bst.small_config(), mlp_dim=64, key=jr.key(0))


@pytest.mark.slow
def test_cli_tiny_run(tmp_path):
    rc = main(
        ["bst", "--small", "--models", "SLIDE", "BST:SH:S4", "--steps", "7", "--out", str(tmp_path)]
    )
    assert rc == 0
    payload = json.loads((tmp_path / "bst_lm.json").read_text())
    assert set(payload["results"]) == {"SLIDE", "BST:SH:S4"}
    assert payload["config"]["steps"] == 7  # the explicit flag wins over --small's 20
    for r in payload["results"].values():
        # one record per LOG_EVERY = 5 steps, plus the final partial window (steps 6-7)
        assert r["train_loss_steps"] == [5, 7] and len(r["train_loss"]) == 2
        assert all(1.0 < p < 1e4 for p in r["perplexity"].values())
    sizes = [r["parameters"] for r in payload["results"].values()]
    assert max(sizes) / min(sizes) < 1.05, "parameter counts should be matched"
    assert (tmp_path / "bst_lm.png").stat().st_size > 0
    assert (tmp_path / "bst_lm.md").read_text().startswith("| model")
