"""The `koopman` experiment runner: a tiny CLI run, period selection, table, bad options."""

import argparse
import importlib
import json
import math
import pathlib
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import lineax_seq as ls
from lineax_seq.__main__ import main
from lineax_seq.experiments import _koopman as kx
from lineax_seq.experiments._cli import output_problem


def test_cli_tiny_run(tmp_path, capsys, monkeypatch):
    argv = ["koopman", "--system", "duffing", "--small", "--variants", "koopman/linear"]
    argv += ["--periods", "1,5,50", "--horizons", "20,50", "--out", str(tmp_path)]
    argv += ["--system-param", "dt=0.02", "--discretization", "exact"]
    built, build = [], kx.build_model

    def recording_build(*args, **kwargs):
        built.append(build(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(kx, "build_model", recording_build)
    assert main(argv) == 0
    # --discretization reaches the Koopman model (the baseline has no latent dynamics).
    assert [m.dynamics.discretization for m in built if isinstance(m, ls.KoopmanAutoencoder)] == [
        "exact"
    ]
    printed = capsys.readouterr().out
    assert "| duffing (dt=0.02) |" in printed and "MSE over 50 steps" in printed

    payload = json.loads((tmp_path / "koopman_table.json").read_text())
    assert payload["config"]["steps"] == 20 and payload["config"]["periods"] == [1, 5, 50]
    row = payload["systems"]["duffing"]
    assert row["command"] == payload["command"] and row["config"]["steps"] == 20
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
    again = vars(_parse(*command[4:]))
    for name, value in payload["config"].items():
        if name not in ("command", "out", "small"):
            want = tuple(value) if isinstance(value, list) else value
            if name == "variants":
                want = tuple(kx.VARIANT_SPELLINGS[v] for v in value)
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


def test_table_scale_is_x100_except_lorenz():
    """Table 1.1: MSE x100, Lorenz unscaled."""
    assert kx.scale_of("lorenz") == 1.0
    assert all(kx.scale_of(s) == 100.0 for s in kx.SYSTEM_NAMES if s != "lorenz")


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
    assert rows[1].split(" | ")[1] == "1e+09 / 20.54"  # large, but finite: as in the JSON
    assert rows[1].endswith("| x / 22.45 | 7 |")  # exploded (inf; null in the JSON)
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
        (["--k-scale", "nan"], "'nan' is not a finite number"),  # trained every model to NaN
        (["--train-reencode", "0"], "--train-reencode: '0' is not a positive integer"),
        (["--horizons", "10" * 11], r"at most 100,000 steps"),  # an OverflowError
        (["--seed", str(2**32)], "'4294967296' is not a seed"),  # seed 0's key again
        (["--seed", "-1"], "'-1' is not a seed"),
        (["--out", ""], "'' is not a path"),  # it wrote into the current directory
    ],
)
def test_bad_options(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit):  # (were a check to fail, the run writes to tmp_path)
        main(["koopman", *argv, "--out", str(tmp_path)])
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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--window", "41"], r"--window 41: must be at most --train-length 40 \(.* 42 states"),
        (["--window", "600", "--train-length", "500"], "--window 600: must be at most"),
        (["--train-reencode", "5"], r"--train-reencode 5: must be below --window 5 \(a 5-step"),
        (
            ["--system", "pendulum", "--system-param", "g=1", "--system-param", "g=2"],
            r"--system-param g=2: g is already given \(g=1\); give each parameter once",
        ),
        (["--system-param", "g=1"], r"--system-param g=1: g is not a parameter of the 'duffing'"),
        (["--all", "--system-param", "g=1"], "--system-param g=1: .*'parabolic' system"),
        (["--system", "pendulum", "--system-param", "g=-1"], "g=-1: Pendulum.g must be a pos"),
        (["--out", "{tmp}/file"], "--out .*file: exists and is not a directory"),
        (["--out", "{tmp}/file/x"], "--out .*x: .*file is a file, not a directory"),
        (["--system", "pendulum", "--all"], "argument --all: not allowed with argument --system"),
    ],
)
def test_usage_errors_before_training(argv, message, tmp_path, capsys):
    """Each was a traceback, the --out ones after training every model of the system."""
    (tmp_path / "file").touch()
    argv = [a.format(tmp=tmp_path) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        main(["koopman", "--small", *argv])
    err = capsys.readouterr()
    assert exit_info.value.code == 2 and "==" not in err.out  # no system started
    assert err.err.splitlines()[-1].startswith("python -m lineax_seq koopman: error: ")
    assert re.search(message, err.err.splitlines()[-1]), err.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written


def test_a_system_that_cannot_be_simulated_is_a_usage_error(tmp_path, capsys):
    """Valid but extreme --system-param values stall the solver: that was a traceback
    from inside JIT ending in Equinox's EquinoxRuntimeError."""
    argv = ["koopman", "--small", "--system", "duffing", "--system-param", "dt=1000"]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "python -m lineax_seq koopman: error: --system-param dt=1000: simulating duffing "
        "failed (The maximum number of solver steps was reached); use values nearer the "
        "system's defaults"
    )


def test_out_files_are_checked_before_training(tmp_path, capsys):
    """A koopman_table.json that is not a table, or a directory where a result file goes,
    failed after all the training (the table is merged into at the end)."""
    table = tmp_path / "koopman_table.json"
    figure = tmp_path / "koopman_fig_horizon_duffing.png"
    for setup, message in (
        (lambda: table.write_text("not json"), r"koopman_table.json: .*move it away"),
        (lambda: table.write_text("[1, 2]"), r"is not a koopman table"),
        # Rows the run would fail to merge or print, after training (a KeyError, a TypeError).
        (lambda: table.write_text('{"systems": {"lorenz": {}}}'), r"KeyError: 'variants'"),
        (
            lambda: table.write_text(
                json.dumps({"systems": {"duffing": _fake_row(1.0)}}).replace(
                    '"none": 1.0', '"none": "1.0"'
                )
            ),
            r"a row of .* cannot be read \(Type",  # (TypeCheckError under the test hook)
        ),  # fmt: skip
        (lambda: figure.mkdir(), r"koopman_fig_horizon_duffing.png is a directory"),
    ):
        setup()
        with pytest.raises(SystemExit) as exit_info:
            main(["koopman", "--small", "--out", str(tmp_path)])
        err = capsys.readouterr()
        assert exit_info.value.code == 2 and "==" not in err.out  # no system started
        assert re.search(message, err.err.splitlines()[-1]), err.err
        table.unlink(missing_ok=True)


def test_unwritable_out_is_a_usage_error(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if output_problem("--out", tmp_path / "x") or not output_problem("--out", locked):
        pytest.skip("permissions are not enforced here (root?)")
    with pytest.raises(SystemExit) as exit_info:
        main(["koopman", "--small", "--out", str(locked / "results")])
    assert exit_info.value.code == 2
    assert re.search(r"--out .*results: cannot write in .*locked", capsys.readouterr().err)


@pytest.mark.skipif(not pathlib.Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_out_on_a_mount_that_refuses_it_is_a_usage_error(capsys):
    """Under /proc no new directory can be made, even by root, whom `os.access` lets
    through: a usage error before any training, not a traceback after it."""
    with pytest.raises(SystemExit) as exit_info:
        main(["koopman", "--small", "--out", "/proc/lineax_seq/results"])
    err = capsys.readouterr()
    assert exit_info.value.code == 2 and "==" not in err.out
    assert re.search(r"--out /proc/lineax_seq/results: cannot write in /proc \(", err.err)


def test_window_as_long_as_the_trajectories_is_usable():
    # A 40-step trajectory holds 41 states: one window of 40 steps (41 states) fits.
    args = _parse("--small", "--window", "40")
    assert kx.options_problem(args) is None
    assert kx._windows(np.zeros((2, 41, 3)), 40).shape == (2, 41, 3)


def test_a_variant_subset_draws_what_the_full_run_draws(tmp_path, monkeypatch):
    """`--variants` picks rows, not random numbers: a subset trains on the same data and
    builds and trains each model from the same keys as a run of every variant."""
    seen = {}  # variant set -> kind -> (init key, train key, training data)

    def recording_build(kind, *args, key, **kwargs):
        seen[run_of][kind] = [jr.key_data(key)]
        return kind

    def diverging_train(kind, xs, *, key, **kwargs):
        seen[run_of][kind] += [jr.key_data(key), xs]
        raise FloatingPointError("not trained in this test")  # skips the evaluation

    monkeypatch.setattr(kx, "build_model", recording_build)
    monkeypatch.setattr(kx, "train_model", diverging_train)
    monkeypatch.setattr(kx, "plot_portraits", lambda *a, **k: tmp_path / "p.png")
    monkeypatch.setattr(kx, "plot_curves", lambda *a, **k: tmp_path / "c.png")
    args = _parse("--small", "--horizons", "10")
    floors = {}
    for run_of in (kx.VARIANTS, kx.VARIANTS[3:], kx.VARIANTS[1:3][::-1]):
        seen[run_of] = {}
        res = kx.run_system("duffing", args, kx.system_key(0, "duffing"), tmp_path, variants=run_of)
        floors[run_of] = res["floor"]  # from the test states
        assert list(seen[run_of]) == [*run_of, "baseline"]
    full = seen.pop(kx.VARIANTS)
    for run_of, drawn in seen.items():
        assert floors[run_of] == floors[kx.VARIANTS]
        for kind, arrays in drawn.items():
            for a, b in zip(arrays, full[kind], strict=True):
                np.testing.assert_array_equal(a, b, err_msg=f"{kind} in a run of {run_of}")
    # Each model draws its own keys.
    assert len({bytes(np.asarray(v[0])) for v in full.values()}) == len(full)


def test_floor_is_in_the_tables_units(tmp_path, monkeypatch):
    """The floor column is scaled like every other cell (x100 for Duffing)."""

    def diverging_train(*args, **kwargs):
        raise FloatingPointError("not trained in this test")  # skips the evaluation

    monkeypatch.setattr(kx, "build_model", lambda kind, *args, **kwargs: kind)
    monkeypatch.setattr(kx, "train_model", diverging_train)
    monkeypatch.setattr(kx, "plot_portraits", lambda *a, **k: tmp_path / "p.png")
    monkeypatch.setattr(kx, "plot_curves", lambda *a, **k: tmp_path / "c.png")
    curve = lambda system, test_xs, **kwargs: np.linspace(0.0, 1.0, test_xs.shape[1] - 1)
    monkeypatch.setattr(kx, "sensitivity_floor", curve)
    args = _parse("--small", "--horizons", "11")
    res = kx.run_system("duffing", args, kx.system_key(0, "duffing"), tmp_path)
    assert kx.scale_of("duffing") == 100
    assert res["floor"]["horizons"] == {"11": pytest.approx(100 * 0.5)}  # mean of the ramp


def _parse(*argv: str) -> argparse.Namespace:
    return kx.parse_args(list(argv))


def test_small_preset_yields_to_explicit_options():
    small = vars(_parse("--small"))
    assert {k: small[k] for k in kx.SIZES} == {k: s for k, (_, s) in kx.SIZES.items()}
    # As bst's --small: explicit options win, larger than the preset's or not.
    args = _parse("--small", "--steps", "100", "--window", "8", "--num-train", "2")
    assert (args.steps, args.window, args.num_train) == (100, 8, 2)
    assert (args.batch_size, args.latent, args.train_length) == (16, 16, 40)
    assert vars(_parse("--steps", "7", "--small"))["steps"] == 7  # order does not matter


def test_defaults_are_the_committed_run(capsys):
    # The default command is still the committed koopman_table.json's run: same config
    # (so the same models, data and keys) and the same recorded command.
    committed = json.loads(COMMITTED.read_text())
    args = _parse("--all")
    args.command = "koopman"
    config = kx._config(args)
    assert {k: config[k] for k in committed["config"] if k != "out"} == {
        k: v for k, v in committed["config"].items() if k != "out"
    }
    assert config["system_param"] == []  # the option the committed run predates
    assert "python -m lineax_seq " + " ".join(kx._command_line(args)) == committed["command"]
    with pytest.raises(SystemExit):
        main(["koopman", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default: the checkout's benchmarks/results, the committed results" in text
    assert "explicit options still win" in text and "(default: 800; --small: 20)" in text


def test_demo_settings_and_metrics(tmp_path, monkeypatch, capsys):
    # The demo trains what it trained before (run_system's options, per scale), and its
    # section writes its metrics beside the figures.
    seen = []
    cell = {"none": 2.0, "every_step": 1.0, "periodic": 0.5, "best_k": 10, "all_k": {}}
    fake = {
        "system": "duffing",
        "variants": {
            kx.LABELS[kx.VARIANTS[0]]: {"horizons": {"100": cell, "1000": cell}},
            kx.BASELINE: {"horizons": {"100": {"mlp": 3.0}, "1000": {"mlp": 4.0}}},
        },
        "figures": ["a.png", "b.png"],
    }

    def fake_run(name, args, key, *a, **k):
        seen.append(args)
        # The key of `koopman --system duffing --seed 0`, so that command reproduces it.
        want = jr.key_data(kx.system_key(0, "duffing"))
        assert name == "duffing" and np.array_equal(jr.key_data(key), want)
        return fake

    monkeypatch.setattr(kx, "run_system", fake_run)
    kx.demo(tmp_path, small=False)
    kx.demo(tmp_path, small=True)
    sizes = [{k: getattr(a, k) for k in kx.SIZES} for a in seen]
    assert sizes[0] == {
        "steps": 1500, "batch_size": 128, "window": 10, "latent": 128, "width": 64,
        "num_train": None, "train_length": 500, "num_test": 100,
    }  # fmt: skip
    assert sizes[1] == {
        "steps": 20, "batch_size": 16, "window": 5, "latent": 16, "width": 16,
        "num_train": 4, "train_length": 40, "num_test": 4,
    }  # fmt: skip
    assert all(a.variants == (("koopman", "linear"),) and a.seed == 0 for a in seen)
    metrics = json.loads((tmp_path / "koopman_metrics.json").read_text())
    assert metrics["variants"] == fake["variants"] and metrics["config"]["steps"] == 20
    assert "koopman_metrics.json" in capsys.readouterr().out


COMMITTED = pathlib.Path(__file__).parents[1] / "benchmarks/results/koopman_table.json"


def _fake_row(value: float, horizons=("100",)) -> dict:
    cell = {"none": value, "periodic": value / 2, "every_step": value, "best_k": 1}
    return {
        "variants": {
            kx.LABELS[kx.VARIANTS[0]]: {"horizons": {h: cell for h in horizons}},
            kx.BASELINE: {"horizons": {h: {"mlp": value} for h in horizons}},
        }
    }


def test_merged_rows_keep_their_config_and_command(tmp_path):
    """Merging runs with other settings into one table kept only the last run's config."""
    kx.save_results({"duffing": _fake_row(1.0, ("20", "50"))}, _parse("--small"), tmp_path)
    path = tmp_path / "koopman_table.json"
    first = json.loads(path.read_text())
    assert first["command"] == first["systems"]["duffing"]["command"]
    assert first["systems"]["duffing"]["config"]["steps"] == 20
    # The same settings for another system: one config, no footnotes, but two commands.
    pendulum = _parse("--system", "pendulum", "--small")
    kx.save_results({"pendulum": _fake_row(2.0)}, pendulum, tmp_path)
    assert "[^" not in (tmp_path / "koopman_table.md").read_text()
    assert "command" not in json.loads(path.read_text())
    # Other settings: each row says what made it, and the table marks which is which.
    other = _parse("--system", "parabolic", "--small", "--steps", "7", "--variants", "koopman/mlp")
    kx.save_results({"parabolic": _fake_row(3.0)}, other, tmp_path)
    payload = json.loads(path.read_text())
    rows = payload["systems"]
    assert "config" not in payload and "command" not in payload and "merged" in payload
    assert rows["duffing"]["config"]["steps"] == rows["pendulum"]["config"]["steps"] == 20
    assert rows["parabolic"]["config"]["steps"] == 7
    assert rows["parabolic"]["config"]["variants"] == ["koopman/mlp"]
    assert "--system parabolic --steps 7 " in rows["parabolic"]["command"]
    assert "--system duffing --steps 20 " in rows["duffing"]["command"]
    table = (tmp_path / "koopman_table.md").read_text()
    assert "| duffing [^1] |" in table and "| pendulum [^1] |" in table
    assert "| parabolic [^2] |" in table
    notes = [line for line in table.splitlines() if line.startswith("[^")]
    assert len(notes) == 2
    assert notes[0].startswith("[^1]: variants=koopman/linear,koopman/mlp,mlp/linear,mlp/mlp, ")
    assert "steps=20" in notes[0] and "steps=7" in notes[1]
    assert rows["duffing"]["command"] in notes[0] and rows["pendulum"]["command"] in notes[0]
    assert rows["parabolic"]["command"] in notes[1]
    # Rerunning a row's own command keeps one row per system (the footnotes follow).
    again = _parse("--system", "parabolic", "--small")
    kx.save_results({"parabolic": _fake_row(3.0)}, again, tmp_path)
    assert "[^" not in (tmp_path / "koopman_table.md").read_text()


def test_table_leaves_out_horizons_without_rows():
    """The parabolic attractor has no 1000-step row in the paper's table, nor in ours:
    alone, it printed that table's header with no row under it."""
    table = kx.format_table({"parabolic": _fake_row(1.0, ("100", "1000"))})
    assert "MSE over 100 steps" in table and "MSE over 1000 steps" not in table


def test_exploded_cells_are_json_null(tmp_path):
    """An exploded model's MSE was written as Python's `Infinity`, which is not JSON (other
    parsers refuse the file): it is `null` now, and read back as exploded ("x")."""
    kx.save_results({"duffing": _fake_row(math.inf)}, _parse("--small"), tmp_path)

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    payload = json.loads((tmp_path / "koopman_table.json").read_text(), parse_constant=refuse)
    cell = payload["systems"]["duffing"]["variants"][kx.LABELS[kx.VARIANTS[0]]]["horizons"]
    assert cell["100"]["none"] is None and cell["100"]["periodic"] is None
    assert "| duffing | x / 0.1152 | x / 0.0112 |" in (tmp_path / "koopman_table.md").read_text()
    # Large but finite is a number in both files (the table wrote "x" above 1e6), and a
    # float32 curve of large finite errors averages to a finite MSE (its float32 sum
    # overflowed: null).
    kx.save_results({"duffing": _fake_row(6.4e6)}, _parse("--small"), tmp_path)
    assert "| duffing | 6.4e+06 / 0.1152 |" in (tmp_path / "koopman_table.md").read_text()
    assert kx.mse_at(np.full(1000, 3e36, np.float32), 1000) == pytest.approx(3e36, rel=1e-6)


def test_runs_into_the_committed_results_keep_them(tmp_path, monkeypatch, capsys):
    """Without --out a run writes into the committed results: a `--small` smoke run (or
    a subset of the variants) replaced the committed rows and figures there. Runs with
    other settings now get their own names; the committed run's own settings, and any
    run given its own --out, keep the plain ones."""
    monkeypatch.setattr(kx, "results_dir", lambda: tmp_path)
    written = []

    def fake_run_system(name, args, key, out_dir, *, variants, suffix):
        written.append(f"koopman_fig_portraits_{name}{suffix}.png")
        return {**_fake_row(1.0), "seconds": 0.0}

    monkeypatch.setattr(kx, "run_system", fake_run_system)
    runs = {
        ("--small",): "_small",
        ("--small", "--steps", "50"): "_small_50steps",
        ("--variants", "koopman/linear"): "_" + kx.settings_tag({"variants": ["koopman/linear"]}),
        ("--steps", "3000"): "_3000steps",
        (): "",
    }
    for argv, suffix in runs.items():
        args = _parse("--system", "duffing", *argv)
        assert kx.output_suffix(args) == suffix, argv
        kx.run(args)
        assert (tmp_path / f"koopman_table{suffix}.json").is_file(), argv
        assert written[-1] == f"koopman_fig_portraits_duffing{suffix}.png"
    assert len(list(tmp_path.glob("koopman_table*.json"))) == len(runs)
    # A run given its own directory writes the plain names there.
    own = tmp_path / "own"
    kx.run(_parse("--system", "duffing", "--small", "--out", str(own)))
    assert {p.name for p in own.glob("koopman_table*")} == {
        "koopman_table.json",
        "koopman_table.md",
    }
    assert written[-1] == "koopman_fig_portraits_duffing.png"
    capsys.readouterr()


@pytest.mark.parametrize(
    "path", sorted(COMMITTED.parent.glob("koopman_table*.json")), ids=lambda p: p.name
)
def test_committed_tables_load_with_their_run_as_every_rows(path):
    """The committed files predate per-row configs: their one config is every row's."""
    payload = json.loads(path.read_text())
    systems = kx.load_table(path)
    assert systems.keys() == payload["systems"].keys()
    for res in systems.values():
        assert res["command"] == payload["command"]
        config = kx.row_config(payload["config"])
        assert {k: res["config"][k] for k in config} == config
        assert res["config"]["system_param"] == config.get("system_param", [])
    # and the table drawn from them is the committed one
    assert kx.format_table(systems) + "\n" == path.with_suffix(".md").read_text()


def test_merging_into_a_committed_table(tmp_path):
    (tmp_path / "koopman_table.json").write_text(COMMITTED.read_text())
    committed = json.loads(COMMITTED.read_text())
    args = _parse("--system", "duffing", "--steps", "3000", "--variants", "koopman/linear")
    kx.save_results({"duffing": _fake_row(1.0)}, args, tmp_path)
    rows = json.loads((tmp_path / "koopman_table.json").read_text())["systems"]
    assert rows["pendulum"]["command"] == committed["command"]  # the old rows' run
    assert rows["pendulum"]["config"]["steps"] == 800 and rows["duffing"]["config"]["steps"] == 3000
    assert rows["pendulum"]["variants"] == committed["systems"]["pendulum"]["variants"]
    table = (tmp_path / "koopman_table.md").read_text()
    assert "| pendulum [^1] |" in table and "| duffing [^2] |" in table
    assert f"`{committed['command']}`" in table
    notes = [line for line in table.splitlines() if line.startswith("[^")]
    assert notes[0].startswith("[^1]: variants=koopman/linear,koopman/mlp,mlp/linear,mlp/mlp, ")
    assert notes[1].startswith("[^2]: variants=koopman/linear, steps=3000: ")


def test_discretization_option(key):
    assert _parse().discretization == "bilinear"
    args = _parse("--small", "--discretization", "exact")
    build = lambda kind: kx.build_model(
        kind, 2, 0.01, latent=4, width=8, discretization=args.discretization, key=key
    )
    assert build(("koopman", "linear")).dynamics.discretization == "exact"
    assert isinstance(build(("mlp", "linear")).dynamics, ls.MLPDynamics)  # Euler steps
    with pytest.raises(SystemExit):
        _parse("--discretization", "zoh")


def test_train_reencode_option(key, monkeypatch):
    """`--train-reencode K` reaches the autoencoders' training loss (the library's
    `koopman_loss(reencode_every=K)`), changes what they learn, and is recorded."""
    assert _parse().train_reencode is None  # the paper's setting for these systems
    args = _parse("--small", "--train-reencode", "2")
    assert kx.options_problem(args) is None
    assert "--train-reencode 2" in " ".join(kx._command_line(args))

    seen, real = [], ls.koopman_loss
    monkeypatch.setattr(
        ls, "koopman_loss", lambda *a, **kw: seen.append(kw["reencode_every"]) or real(*a, **kw)
    )
    xs = np.asarray(jr.normal(key, (2, 12, 2)))
    model = kx.build_model(("koopman", "mlp"), 2, 0.01, latent=4, width=8, key=key)
    train = lambda every: kx.train_model(
        model,
        xs,
        steps=3,
        batch_size=4,
        window=5,
        lr=1e-2,
        dynamics_lr=1e-2,
        weight_decay=0.0,
        prediction=1.0,
        reencode_every=every,
        key=key,
    )[0]
    flat = lambda m: np.concatenate(
        [np.ravel(a) for a in jax.tree.leaves(eqx.filter(m, eqx.is_array))]
    )
    plain, reencoded = train(None), train(2)
    assert seen == [None, 2]  # traced once per training
    assert not np.allclose(flat(plain), flat(reencoded))
