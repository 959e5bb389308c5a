"""The `koopman` experiment runner: a tiny CLI run, period selection, table, bad options."""

import argparse
import importlib
import json
import math
import re

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import lineax_seq as ls
from lineax_seq.__main__ import main
from lineax_seq.experiments import _koopman as kx


def test_cli_tiny_run(tmp_path, capsys):
    argv = ["koopman", "--system", "duffing", "--small", "--variants", "koopman/linear"]
    argv += ["--periods", "1,5,50", "--horizons", "20,50", "--out", str(tmp_path)]
    argv += ["--system-param", "dt=0.02"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| duffing (dt=0.02) |" in printed and "MSE over 50 steps" in printed

    payload = json.loads((tmp_path / "koopman_table.json").read_text())
    assert payload["config"]["steps"] == 20 and payload["config"]["periods"] == [1, 5, 50]
    assert payload["paper"]["100"]["duffing"][1] == 0.0112
    variants = payload["systems"]["duffing"]["variants"]
    assert set(variants) == {"Koopman / linear dec", "MLP baseline"}
    koop = variants["Koopman / linear dec"]["horizons"]
    assert set(koop) == {"20", "50"}
    for cell in koop.values():
        assert set(cell) == {"none", "every_step", "periodic", "best_k", "all_k"}
        assert set(cell["all_k"]) == {"1", "5", "50"}
        finite = {k: v for k, v in cell["all_k"].items() if math.isfinite(v)}
        # the reported periodic number is the best period's, and k = 1 is "every step"
        assert cell["periodic"] == min(finite.values()) == cell["all_k"][str(cell["best_k"])]
        assert cell["every_step"] == cell["all_k"]["1"]
        # k = 50 >= the 50 evaluated steps: never reencodes, i.e. the "none" unroll
        assert cell["all_k"]["50"] == pytest.approx(cell["none"], rel=1e-6)
    # MSEs are averages of the per-step curve: over 50 steps vs over the first 20
    curve = np.asarray(variants["Koopman / linear dec"]["curve"]["none"])
    assert koop["50"]["none"] == pytest.approx(100 * curve.mean(), rel=1e-5)
    assert koop["20"]["none"] == pytest.approx(100 * curve[:20].mean(), rel=1e-5)
    assert math.isfinite(variants["MLP baseline"]["horizons"]["50"]["mlp"])

    for name in payload["systems"]["duffing"]["figures"]:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| duffing (dt=0.02) |" in (tmp_path / "koopman_table.md").read_text()
    assert payload["systems"]["duffing"]["params"] == {"dt": 0.02}
    floor = payload["systems"]["duffing"]["floor"]
    assert floor["eps"] == kx.FLOOR_EPS and set(floor["horizons"]) == {"20", "50"}
    assert 0 < floor["horizons"]["20"] < floor["horizons"]["50"] < math.inf

    # The recorded command reproduces the run's options.
    command = payload["command"].split()
    assert command[:4] == ["python", "-m", "lineax_seq", "koopman"]
    parser = argparse.ArgumentParser()
    kx.add_arguments(parser)
    again = vars(parser.parse_args(command[4:]))
    for name, value in payload["config"].items():
        if name not in ("command", "out", "small"):
            want = tuple(value) if isinstance(value, list) else value
            if name == "variants":
                want = tuple(kx.VARIANT_NAMES[v] for v in value)
            if name == "system_param":
                assert value == [["dt", 0.02]]
                want = [tuple(p) for p in value]
            assert again[name] == want, name


def test_best_period_selection():
    steps = np.arange(1, 101, dtype=float)
    curves = {
        "k=1": np.full(100, 0.5),  # flat
        "k=10": 0.01 * steps,  # best early, worse than k=1 after ~step 100
        "k=25": np.full(100, np.inf),  # exploded: never selected
        "k=50": np.full(100, 0.5),  # ties with k=1: the smaller period wins
    }
    periods = (1, 10, 25, 50)
    assert kx.best_period(curves, 10, periods) == (pytest.approx(0.055), 10)
    assert kx.best_period(curves, 100, periods) == (0.5, 1)  # k=10 averages 0.505
    assert kx.best_period(curves, 100, (25, 50, 1)) == (0.5, 1)
    assert kx.best_period({"k=25": curves["k=25"]}, 100, (25,)) == (math.inf, 25)
    assert kx.mse_at(np.array([1.0, 3.0, np.nan]), 2) == 2.0
    assert kx.mse_at(np.array([1.0, 3.0, np.nan]), 3) == math.inf


def test_evaluate_maps_standardised_predictions_back(key):
    # evaluate() unrolls in standardised coordinates; its curves must be the errors of
    # the de-standardised unrolls against the raw truth, mode by mode.
    model = ls.KoopmanAutoencoder(2, 6, width=8, key=key)
    test_xs = np.asarray(jr.normal(jr.key(1), (3, 13, 2))) * 5.0 + 2.0
    mean, std = np.array([2.0, 1.0]), np.array([5.0, 4.0])
    curves, preds = kx.evaluate(model, test_xs, steps=12, periods=(1, 4), mean=mean, std=std)
    assert set(curves) == {"none", "k=1", "k=4"}
    x0s = jnp.asarray((test_xs[:, 0] - mean) / std, jnp.float32)
    for name, k in [("none", None), ("k=4", 4)]:
        ref = jax.vmap(lambda x, k=k: ls.unroll(model, x, steps=12, reencode_every=k))(x0s)
        ref = np.asarray(ref) * std + mean
        np.testing.assert_allclose(preds[name], ref, rtol=1e-5, atol=1e-5)
        err = np.mean((ref - test_xs[:, 1:]) ** 2, axis=(0, 2))
        np.testing.assert_allclose(curves[name], err, rtol=1e-5)


def test_sensitivity_floor():
    # Unperturbed, the exact dynamics reproduce the test trajectories: floor 0. Perturbed by
    # delta, the first step (dt = 0.01, flow map ~ identity) is off by about delta.
    system = ls.get_system("lotka_volterra")
    test_xs = np.asarray(ls.sample_trajectories(system, jr.key(0), 8, 30)[0])
    std = np.array([0.5, 2.0])
    zero = kx.sensitivity_floor(system, test_xs, std=std, eps=0.0, key=jr.key(1))
    assert zero.shape == (30,) and np.all(zero == 0)
    floor = kx.sensitivity_floor(system, test_xs, std=std, eps=1e-2, key=jr.key(1))
    delta = 1e-2 * std * np.asarray(jr.normal(jr.key(1), test_xs[:, 0].shape))
    assert floor[0] == pytest.approx(np.mean(delta**2), rel=0.05)
    assert np.all(floor > 0)


def test_format_table_ours_beside_paper():
    cell = {"none": 2.0, "periodic": 0.5, "every_step": 1.0, "best_k": 25, "all_k": {}}
    res = {
        "variants": {
            "Koopman / linear dec": {"horizons": {"100": cell, "1000": dict(cell, none=1e9)}},
            "MLP baseline": {"horizons": {"100": {"mlp": 3.0}, "1000": {"mlp": math.inf}}},
        }
    }
    floored = dict(res, floor={"eps": 1e-3, "horizons": {"100": 0.25, "1000": 7.0}})
    table = kx.format_table({"duffing": floored, "parabolic": res})
    rows = [line for line in table.splitlines() if line.startswith("| duffing")]
    assert rows[0].split(" | ")[1:3] == ["2 / 0.1152", "0.5 / 0.0112"]
    assert rows[0].endswith("| 3 / 0.405 | 0.25 |")  # the MLP, then the floor
    assert rows[0].count("- / ") == 6  # variants not run
    assert rows[1].split(" | ")[1] == "x / 20.54"  # exploded
    assert rows[1].endswith("| x / 22.45 | 7 |")
    parabolic = next(line for line in table.splitlines() if line.startswith("| parabolic"))
    assert parabolic.endswith("| 3 / 0.2674 | - |")  # no floor recorded
    # the paper has no 1000-step parabolic row, so neither does the table
    assert sum(line.startswith("| parabolic") for line in table.splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--system", "vanderpol"], "invalid choice: 'vanderpol'"),
        (["--variants", "koopman/linear,koopman/rnn"], "unknown variant.*koopman/rnn.*mlp/mlp"),
        (["--periods", "1,0,10"], "--periods='1,0,10' must be distinct positive"),
        (["--periods", "ten"], "--periods='ten' must be a comma-separated list"),
        (["--horizons", "100,100"], "--horizons='100,100' must be distinct"),
        (["--steps", "-3"], "'-3' is not a positive integer"),
        (["--prediction", "-1"], "'-1' is not a non-negative finite number"),
        (["--system-param", "g"], "expected NAME=VALUE .* got 'g'"),
        (["--system-param", "g=fast"], "expected NAME=VALUE .* got 'g=fast'"),
    ],
)
def test_bad_options(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(["koopman", *argv])
    assert re.search(message, capsys.readouterr().err)


def test_main_imports_only_the_chosen_command(monkeypatch, capsys):
    imported = []
    real = importlib.import_module
    monkeypatch.setattr(
        importlib, "import_module", lambda name: imported.append(name) or real(name)
    )
    with pytest.raises(SystemExit):
        main(["--help"])
    assert imported == []
    assert "reproduce the papers' experiments" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["koopman", "--help"])
    assert imported == ["lineax_seq.experiments._koopman"]
    assert "--prediction" in capsys.readouterr().out


def test_system_param_is_checked_before_training(tmp_path):
    for argv, message in [
        (["--system", "duffing", "--system-param", "g=1"], "g is not a parameter of the 'duffing'"),
        (["--system", "pendulum", "--system-param", "g=-1"], "Pendulum.g must be a positive"),
        (["--all", "--system-param", "g=1"], "g is not a parameter of the 'parabolic'"),
        (["--system", "pendulum", "--system-param", "g=1", "--system-param", "g=2"], "twice"),
    ]:
        with pytest.raises(ValueError, match=message):
            main(["koopman", *argv, "--small", "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())  # nothing trained, nothing written


def test_window_longer_than_trajectories(tmp_path):
    with pytest.raises(ValueError, match="--window=50 must be below --train-length=40"):
        main(["koopman", "--window", "50", "--train-length", "40", "--out", str(tmp_path)])
