"""The train loop (metrics, eval, progress, plots, non-finite errors, resume) and
checkpoints (round trip, pruning, truncated / mismatched files, interrupted saves)."""

import inspect
import json
import pathlib
import re
import shutil
import types
import warnings

import _training_sharding_common as common
import equinox as eqx
import grain
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
import pytest
from _compiles import compilations

import lineax_seq as ls
from lineax_seq.training import _checkpoint, _train


def _records(out_dir):
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def _leaves(model):
    return [np.asarray(x) for x in jax.tree.leaves(eqx.filter(model, eqx.is_array))]


def _opt_state(model):
    return common.optimizer().init(eqx.filter(model, eqx.is_inexact_array))


@pytest.fixture(scope="module")
def data():
    return common.batches(12, 8)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, data):
    """12 steps, eval every 4, log every 2, checkpoints every 5 (last 2 kept), plot."""
    out = tmp_path_factory.mktemp("full")
    result = ls.train(
        common.make_model(),
        common.optimizer(),
        common.loss_fn,
        data,
        steps=12,
        key=jr.key(0),
        eval_data=data[:2],
        eval_every=4,
        log_every=2,
        out_dir=out,
        checkpoint_every=5,
        keep_checkpoints=2,
        plot=True,
        progress=False,
    )
    return out, result


def test_train_writes_metrics_checkpoints_and_plot(full_run):
    out, result = full_run
    records = _records(out)
    assert records == result.history
    train = [r for r in records if r["split"] == "train"]
    evals = [r for r in records if r["split"] == "eval"]
    # Every 2 steps, plus a flush before each checkpoint (step 5) and eval.
    assert [r["step"] for r in train] == [2, 4, 5, 6, 8, 10, 12]
    assert [r["step"] for r in evals] == [4, 8, 12]
    assert set(train[1]) == {"step", "split", "loss", "grad_norm", "max_err", "lr", "samples_per_s"}
    schedule = common.optimizer().learning_rate_schedule
    assert [r["lr"] for r in train] == [float(schedule(r["step"])) for r in train]
    assert train[-1]["loss"] < train[0]["loss"]
    assert evals[-1]["loss"] < evals[0]["loss"]
    assert [p.name for p in ls.list_checkpoints(out / "checkpoints")] == [
        "step_00000010",
        "step_00000012",  # the end of the run is always checkpointed
    ]
    assert (out / "curves.png").stat().st_size > 1000
    assert result.step == 12 and result.resumed_from is None


def test_keys_and_logged_means_follow_the_documentation(tmp_path):
    """Step s draws `fold_in(train_key, s)` and eval batch i after n steps
    `fold_in(fold_in(eval_key, n), i)`; a train record is the mean of its window's
    steps; a resumed run takes the checkpoint's key, not the one it is given."""

    def loss_fn(model, batch, key):
        draw = jr.uniform(key)
        return jnp.sum(model["w"] * batch["x"]), {"draw": draw, "value": batch["x"][0]}

    data = [{"x": jnp.full((2,), float(i))} for i in range(6)]
    kw = dict(
        steps=6, eval_data=data[:2], eval_fn=loss_fn, eval_every=3, log_every=3,
        checkpoint_every=3, progress=False,
    )  # fmt: skip
    run = lambda out, **more: ls.train(
        {"w": jnp.zeros(2)}, optax.sgd(0.1), loss_fn, data, out_dir=tmp_path / out, **kw | more
    )
    result = run("whole", key=jr.key(0))
    train_key, eval_key = jr.split(jr.key(0))
    uniform = lambda key: float(jr.uniform(key))
    train = [r for r in result.history if r["split"] == "train"]
    evals = [r for r in result.history if r["split"] == "eval"]
    for r, window in zip(train, (range(0, 3), range(3, 6)), strict=True):
        assert r["value"] == pytest.approx(np.mean(window))  # batch i holds i
        want = np.mean([uniform(jr.fold_in(train_key, s)) for s in window])
        assert r["draw"] == pytest.approx(want)
    for r in evals:
        keys = [jr.fold_in(jr.fold_in(eval_key, r["step"]), i) for i in range(2)]
        assert r["draw"] == pytest.approx(np.mean([uniform(k) for k in keys]))
    # Stopped at step 3, then resumed with another key: the same draws as the whole run.
    run("resumed", key=jr.key(0), steps=3)
    resumed = run("resumed", key=jr.key(5))
    assert jnp.array_equal(jr.key_data(resumed.key), jr.key_data(jr.key(0)))
    draws = lambda history: [(r["step"], r["split"], r["draw"]) for r in history]
    assert draws(resumed.history) == draws(result.history)


def test_train_step_compiles_once_per_run_and_not_again(data):
    """The train step is one compiled program for every step of a run, and a second run
    with the same loss and optimiser compiles it no more (its own jit, without
    `eqx.filter_jit`'s wait for each result, hashes the same static parts)."""
    optimizer = common.optimizer()
    model = common.make_model()
    loss_fn = lambda *args: common.loss_fn(*args)  # a step no other test has compiled
    run = lambda: ls.train(model, optimizer, loss_fn, data[:3], steps=3, key=jr.key(0))
    with compilations() as first:
        run()
    with compilations() as second:
        run()
    assert first.count("jit(train_step)") == 1 and "jit(train_step)" not in second


def test_batch_numbers_are_traced_and_strings_named(data, tmp_path):
    """A batch's Python numbers are arrays to the train and eval steps, with or without a
    mesh: a new value compiles nothing (as a static leaf it compiled every step). A
    string leaf is a TypeError naming it, before any step."""
    scaled = lambda model, batch, key: common.loss_fn(model, batch["xy"], key)
    batches = [{"xy": xy, "scale": i + 1} for i, xy in enumerate(data[:4])]
    with compilations() as compiled:
        ls.train(
            common.make_model(), common.optimizer(), scaled, batches, steps=4, key=jr.key(0),
            eval_data=batches[:2], log_every=1,
        )  # fmt: skip
    assert compiled.count("jit(train_step)") == 1 and compiled.count("jit(_eval_step)") == 1
    step = ls.make_train_step(scaled, common.optimizer(), donate=False)
    model = common.make_model()
    opt_state = _opt_state(model)
    with compilations() as compiled:
        for batch in batches:
            step(model, opt_state, batch, jr.key(0))
    assert compiled.count("jit(train_step)") <= 1
    texts = [{**batch, "text": np.array(["a"] * 8)} for batch in batches]
    for run in (
        lambda: ls.train(
            common.make_model(), common.optimizer(), scaled, texts, steps=2, key=jr.key(0)
        ),
        lambda: step(model, opt_state, texts[0], jr.key(0)),
        lambda: ls.make_eval_step(scaled)(model, texts[0], jr.key(0)),
    ):
        with pytest.raises(TypeError, match=r"batch leaf \['text'\] must be a numeric or bool"):
            run()


def test_keep_checkpoints_none_keeps_all(data, tmp_path):
    ls.train(
        common.make_model(), common.optimizer(), common.loss_fn, data, steps=4, key=jr.key(0),
        out_dir=tmp_path, checkpoint_every=1, keep_checkpoints=None, progress=False,
    )  # fmt: skip
    assert [p.name for p in ls.list_checkpoints(tmp_path / "checkpoints")] == [
        f"step_{s:08d}" for s in (1, 2, 3, 4)
    ]


def test_progress_bar_shows_loss_and_throughput(data, capsys):
    ls.train(
        common.make_model(),
        common.optimizer(),
        common.loss_fn,
        data[:2],
        steps=2,
        key=jr.key(0),
        log_every=1,
        unit="tokens",
    )
    err = capsys.readouterr().err
    assert "loss=" in err and "tokens/s=" in err


def test_tokens_throughput_counts_token_arrays(monkeypatch):
    """`unit="tokens"` counts the `(B, L)` token ids even when a `(B,)` leaf sorts first,
    as a classification batch's `"label"` does (it counted B tokens per batch)."""
    batch = {"label": np.zeros(4, np.int32), "tokens": np.ones((4, 16), np.int32)}
    loss_fn = lambda w, b, key: (jnp.mean(w[b["tokens"]] ** 2), None)
    per_s = {}
    for unit in ("samples", "tokens"):
        clock = iter(range(10**6))  # the same readings in both runs
        fake = types.SimpleNamespace(perf_counter=lambda clock=clock: float(next(clock)))
        monkeypatch.setattr(_train, "time", fake)
        result = ls.train(
            jnp.ones(8),
            ls.make_optimizer(1e-2),
            loss_fn,
            [batch] * 3,
            steps=3,
            key=jr.key(0),
            log_every=1,
            unit=unit,
            progress=False,
        )
        per_s[unit] = [r[f"{unit}_per_s"] for r in result.history if f"{unit}_per_s" in r]
    assert len(per_s["tokens"]) == 2
    assert per_s["tokens"] == [16 * x for x in per_s["samples"]]


def test_resume_rewinds_metrics_and_matches(full_run, data, tmp_path):
    """A run cut after step 7, resumed from its step-5 checkpoint, replays exactly, with
    the steps the first run compiled (the restored arrays were uncommitted, which
    compiled the train step again)."""
    out_ref, ref = full_run
    out = tmp_path / "run"
    kw = dict(
        key=jr.key(0),
        eval_data=data[:2],
        eval_every=4,
        log_every=2,
        out_dir=out,
        checkpoint_every=5,
        keep_checkpoints=2,
        progress=False,
    )
    args = (common.make_model(), common.optimizer(), common.loss_fn, data)
    ls.train(*args, steps=7, **kw)
    shutil.rmtree(out / "checkpoints/step_00000007")  # as if killed before that save
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 8, "split": "tr')  # and mid-way through a write
    with compilations() as compiled:
        result = ls.train(*args, steps=12, **kw)
    assert result.resumed_from == 5
    assert not [name for name in compiled if "step" in name], compiled
    records = _records(out)
    assert [r["step"] for r in records] == [r["step"] for r in _records(out_ref)]
    for r, s in zip(records, _records(out_ref), strict=True):
        assert r["split"] == s["split"]
        np.testing.assert_array_equal(r["loss"], s["loss"])
    for a, b in zip(_leaves(result.model), _leaves(ref.model), strict=True):
        np.testing.assert_array_equal(a, b)


def test_nonfinite_loss_stops_and_names_step(data, tmp_path):
    bad = [(x, y) for x, y in data[:6]]
    bad[3] = (bad[3][0], np.full_like(bad[3][1], np.nan))
    with pytest.raises(ls.NonFiniteError, match=r"Non-finite loss = nan at train step 4"):
        ls.train(
            common.make_model(),
            common.optimizer(),
            common.loss_fn,
            bad,
            steps=6,
            key=jr.key(0),
            log_every=100,
            out_dir=tmp_path,
            checkpoint_every=2,
            progress=False,
        )
    # The step-2 checkpoint was written, nothing after the NaN.
    assert [p.name for p in ls.list_checkpoints(tmp_path / "checkpoints")] == ["step_00000002"]

    def aux_inf(model, batch, key):
        loss, _ = common.loss_fn(model, batch, key)
        return loss, {"ratio": jnp.float32(1.0) / jnp.float32(0.0)}

    with pytest.raises(ls.NonFiniteError, match=r"Non-finite 'ratio' = inf at train step 1"):
        ls.train(
            common.make_model(),
            common.optimizer(),
            aux_inf,
            data,
            steps=1,
            key=jr.key(0),
            progress=False,
        )


def test_an_update_that_overflows_is_not_checkpointed(data, tmp_path):
    """The loss and gradient norm come before the update: finite, while the update
    overflows the weights. Nothing non-finite is checkpointed or returned."""
    huge = lambda model, batch, key: (1e15 * jnp.sum(model.layers[-1].weight), None)
    with pytest.raises(ls.NonFiniteError, match="Non-finite parameters after train step 1"):
        ls.train(
            common.make_model(), optax.sgd(1e30), huge, data, steps=2, key=jr.key(0),
            out_dir=tmp_path, checkpoint_every=1, progress=False,
        )  # fmt: skip
    assert ls.list_checkpoints(tmp_path / "checkpoints") == []
    with pytest.raises(ls.NonFiniteError, match="Non-finite parameters after train step 1"):
        ls.train(common.make_model(), optax.sgd(1e30), huge, data, steps=1, key=jr.key(0))


def test_stateful_models_are_refused(data):
    """BatchNorm's `eqx.nn.State` would be trained (and decayed) as weights."""
    model, state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(4, "batch", mode="batch")
    with pytest.raises(ValueError, match=r"model holds an eqx.nn.State"):
        ls.train((model, state), common.optimizer(), common.loss_fn, data, steps=1, key=jr.key(0))


def test_resuming_an_advanced_iterator_warns(data, tmp_path):
    """A one-shot iterator replays from where it stands: right for a fresh one, wrong for
    the one an interrupted run advanced. Resuming says so; a list does not need it."""
    run = lambda batches, steps: ls.train(
        common.make_model(), common.optimizer(), common.loss_fn, batches, steps=steps,
        key=jr.key(0), out_dir=tmp_path, checkpoint_every=2, progress=False,
    )  # fmt: skip
    run(iter(data), 2)
    with pytest.warns(UserWarning, match=r"`data` is an iterator, whose next 2 batches"):
        run(iter(data), 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(data, 6)


def _grain_batches(data, **kwargs):
    examples = grain.MapDataset.source(
        [(x, y) for xs, ys in data for x, y in zip(xs, ys, strict=True)]
    )
    return ls.batch_examples(examples, batch_size=8, shuffle=False, **kwargs)


def test_finite_grain_eval_data_is_evaluated_whole(data):
    result = ls.train(
        common.make_model(), common.optimizer(), common.loss_fn, data, steps=1,
        key=jr.key(0), eval_data=_grain_batches(data[:2], num_epochs=1), progress=False,
    )  # fmt: skip
    (record,) = [r for r in result.history if r["split"] == "eval"]
    assert record["step"] == 1
    # Both batches are evaluated (they have equal sizes: the mean of the two losses).
    want = np.mean([float(common.loss_fn(result.model, b, None)[0]) for b in data[:2]])
    np.testing.assert_allclose(record["loss"], want, rtol=1e-5)
    # A finite slice of an endless dataset is finite.
    finite = grain.MapDataset.range(4).repeat()[:8].map(lambda i: data[i % 2]).batch(1)
    result = ls.train(
        common.make_model(), common.optimizer(), common.loss_fn, data, steps=1,
        key=jr.key(0), eval_data=finite.map(lambda b: (b[0][0], b[1][0])), progress=False,
    )  # fmt: skip
    assert [r["step"] for r in result.history if r["split"] == "eval"] == [1]
    # With eval_batches, an endless eval_data is fine too.
    result = ls.train(
        common.make_model(), common.optimizer(), common.loss_fn, data, steps=1,
        key=jr.key(0), eval_data=_grain_batches(data), eval_batches=2, progress=False,
    )  # fmt: skip
    assert [r["step"] for r in result.history if r["split"] == "eval"] == [1]


def test_eval_weights_batches_by_their_size(data):
    """A short last batch counts for its examples: the record is the per-example mean."""
    (x0, y0), (x1, y1) = data[:2]
    uneven = [(x0, y0), (x1[:3], y1[:3])]
    result = ls.train(
        common.make_model(), common.optimizer(), common.loss_fn, data, steps=1,
        key=jr.key(0), eval_data=uneven, progress=False,
    )  # fmt: skip
    (record,) = [r for r in result.history if r["split"] == "eval"]
    whole = (np.concatenate([x0, x1[:3]]), np.concatenate([y0, y1[:3]]))
    want = float(common.loss_fn(result.model, whole, None)[0])
    np.testing.assert_allclose(record["loss"], want, rtol=1e-5)


def test_resume_with_another_data_layout_says_so(data, tmp_path):
    args = (common.make_model(), common.optimizer(), common.loss_fn)
    kw = dict(steps=2, key=jr.key(0), out_dir=tmp_path, checkpoint_every=1, progress=False)
    ls.train(*args, _grain_batches(data), **kw)
    workers = _grain_batches(data, num_workers=2)
    with pytest.raises(ValueError, match=r"data pipeline's layout changed .* num_workers"):
        ls.train(*args, workers, **{**kw, "steps": 3})
    assert ls.list_checkpoints(tmp_path / "checkpoints")[-1].name.endswith("2")  # untouched
    # A plain iterable is replayed to the checkpoint's position: one too short says so
    # (a bare StopIteration escaped).
    plain = tmp_path / "plain"
    ls.train(*args, data[:3], **{**kw, "steps": 3, "out_dir": plain})
    with pytest.raises(ValueError, match=r"`data` ran out after 1 batches while replaying the 3"):
        ls.train(*args, data[:1], **{**kw, "steps": 4, "out_dir": plain})


def test_train_bad_arguments_named(data, no_jaxtyping):
    """Arguments that only the type hints described (refused up front, by name, also
    without jaxtyping's hook)."""
    model, opt, loss = common.make_model(), common.optimizer(), common.loss_fn
    run = lambda **kw: ls.train(
        **{"model": model, "optimizer": opt, "loss_fn": loss, "data": data, "steps": 1,
           "key": jr.key(0), "progress": False, **kw}
    )  # fmt: skip
    with pytest.raises(TypeError, match="resume must be a bool, got resume=1"):
        run(resume=1)
    with pytest.raises(TypeError, match="optimizer must be an optax.GradientTransformation.*None"):
        run(optimizer=None)
    with pytest.raises(TypeError, match="data must be an iterable of batches.*data=5"):
        run(data=5)
    with pytest.raises(ValueError, match="min_shard_size must be an integer >= 0.*-1"):
        run(min_shard_size=-1)
    with pytest.raises(TypeError, match="donate must be a bool, got donate='yes'"):
        ls.make_train_step(loss, opt, donate="yes")
    mesh = ls.make_mesh(data=1, model=1)
    with pytest.raises(ValueError, match="min_shard_size must be an integer >= 0.*'x'"):
        ls.param_sharding(model, mesh, min_shard_size="x")


def test_functions_and_mesh_named_at_construction(data, no_jaxtyping):
    """A loss function, eval function or callback that is not callable, or a mesh that
    is not a `Mesh`, is refused by name when the step (or run) is built; they were
    accepted and failed later, inside the jitted step or after the first steps."""
    model, opt, loss = common.make_model(), common.optimizer(), common.loss_fn
    with pytest.raises(TypeError, match="loss_fn must be a function, got loss_fn=3"):
        ls.make_train_step(3, opt)
    with pytest.raises(TypeError, match="loss_fn must be a function, got loss_fn=None"):
        ls.make_eval_step(None)
    with pytest.raises(TypeError, match="optimizer must be an optax.GradientTransformation"):
        ls.make_train_step(loss, "adam")
    with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh .*mesh='data'"):
        ls.make_train_step(loss, opt, mesh="data")
    run = lambda **kw: ls.train(
        **{"model": model, "optimizer": opt, "loss_fn": loss, "data": data, "steps": 1,
           "key": jr.key(0), "progress": False, **kw}
    )  # fmt: skip
    for kw, message in [
        ({"loss_fn": "mse"}, "loss_fn must be a function, got loss_fn='mse'"),
        ({"eval_fn": 1}, "eval_fn must be a function or None, got eval_fn=1"),
        ({"callback": True}, "callback must be a function or None, got callback=True"),
        ({"mesh": "data"}, "mesh must be a jax.sharding.Mesh .*mesh='data'"),
    ]:
        with pytest.raises(TypeError, match=message):
            run(**kw)


@pytest.mark.parametrize("accumulate_steps", [1, 2])
def test_logged_lr_follows_the_optimiser_state_passed_in(data, accumulate_steps):
    """A run continued from an earlier run's `opt_state` logs the learning rate of its
    next update from the optimiser's own update count (it counted from the loop's step
    0, 0.0093 where the optimiser used 0.0018)."""
    opt = ls.make_optimizer(1e-2, warmup_steps=2, total_steps=8, accumulate_steps=accumulate_steps)
    run = lambda opt_state: ls.train(
        common.make_model(), opt, common.loss_fn, data, steps=4 * accumulate_steps,
        key=jr.key(0), opt_state=opt_state, log_every=accumulate_steps, progress=False,
    )  # fmt: skip
    first = run(None)
    second = run(first.opt_state)
    schedule = opt.learning_rate_schedule
    for result, before in ((first, 0), (second, 4)):
        logged = [r["lr"] for r in result.history if r["split"] == "train"]
        assert logged == [float(schedule(before + u)) for u in range(1, 5)]


def test_steps_zero_evaluates_the_model_as_given(data):
    """`steps=0` with `eval_data` is an evaluation only: one record at step 0, the
    model's own losses (it wrote no record at all)."""
    model, evals = common.make_model(), data[:3]
    result = ls.train(
        model,
        common.optimizer(),
        common.loss_fn,
        data,
        steps=0,
        key=jr.key(0),
        eval_data=evals,
        progress=False,
    )
    (record,) = result.history
    assert (record["step"], record["split"]) == (0, "eval")
    losses = [common.loss_fn(model, b, None) for b in evals]
    np.testing.assert_allclose(record["loss"], np.mean([loss for loss, _ in losses]), rtol=1e-6)
    assert eqx.tree_equal(result.model, model)


def test_eval_runs_in_inference_mode():
    """The eval step calls the loss on `eqx.nn.inference_mode(model)`: a train loss that
    passes its key to dropout evaluates deterministically, as without dropout (it was
    a random draw that depended on the key)."""
    model = eqx.nn.Sequential([eqx.nn.Linear(4, 4, key=jr.key(0)), eqx.nn.Dropout(0.5)])
    loss_fn = lambda m, x, key: (jnp.sum(jax.vmap(lambda v: m(v, key=key))(x) ** 2), None)
    x = jr.normal(jr.key(1), (3, 4))
    eval_step = ls.make_eval_step(loss_fn)
    losses = [float(eval_step(model, x, jr.key(k))["loss"]) for k in (2, 3)]
    want = float(jnp.sum(jax.vmap(model.layers[0])(x) ** 2))
    np.testing.assert_allclose(losses, [want, want], rtol=1e-6)


@pytest.mark.parametrize("steps", [4, 6])
def test_a_run_killed_in_its_final_evaluation_evaluates_when_resumed(data, tmp_path, steps):
    """A run that dies in its final evaluation evaluates when resumed. At steps=4 the
    final checkpoint follows the final evaluation, so the run resumes from step 2 (the
    checkpoint at the last step used to come first, and the resumed run, finding it,
    never evaluated). At steps=6 the 4 batches run out at step 4, after that step's
    periodic checkpoint: the resumed run starts there, and the metrics say that step
    was not evaluated (it used to take any checkpoint's step as evaluated)."""

    class Killed(Exception):
        pass

    class DiesEvaluating:  # the first pass is train's check at the start
        passes = 0

        def __iter__(self):
            self.passes += 1
            if self.passes > 1:
                raise Killed
            return iter(data[:2])

    def run(eval_data):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "`data` ran out", UserWarning)
            return ls.train(
                common.make_model(),
                common.optimizer(),
                common.loss_fn,
                data[:4],
                steps=steps,
                key=jr.key(0),
                eval_data=eval_data,
                out_dir=tmp_path,
                checkpoint_every=2,
                progress=False,
            )

    with pytest.raises(Killed):
        run(DiesEvaluating())
    written = [c.name for c in ls.list_checkpoints(tmp_path / "checkpoints")]
    assert written == ["step_00000002"] if steps == 4 else ["step_00000002", "step_00000004"]
    result = run(data[:2])
    assert result.resumed_from == (2 if steps == 4 else 4)
    assert [(r["step"], r["split"]) for r in result.history if r["split"] == "eval"] == [
        (4, "eval")
    ]
    # Resumed again from its final checkpoint, the finished run does not evaluate twice.
    again = run(data[:2])
    assert again.resumed_from == 4
    assert [(r["step"], r["split"]) for r in again.history if r["split"] == "eval"] == [(4, "eval")]


def test_optimizer_with_extra_args_gets_the_loss(data):
    """An optimiser taking extra arguments gets `value=loss`: reduce_on_plateau, which
    needs it, trains (it failed inside the jitted step) and cuts its scale on a plateau."""
    opt = optax.chain(
        optax.sgd(1e-9), optax.contrib.reduce_on_plateau(patience=1, cooldown=0, factor=0.5)
    )
    with jax.numpy_dtype_promotion("standard"):  # optax's plateau adds int32 and float32
        result = ls.train(
            common.make_model(), opt, common.loss_fn, data, steps=6, key=jr.key(0), progress=False
        )
    assert result.step == 6
    plateau = optax.tree_utils.tree_get(result.opt_state, "scale")
    assert float(plateau) < 1.0  # the loss barely moves at lr 1e-9: the scale was cut


def test_resume_from_a_checkpoint_without_a_key(data, tmp_path):
    """A checkpoint saved with key=None resumes with the key given (as a run's own
    checkpoints, which hold that key): the same steps as a run that saved it."""
    model, opt = common.make_model(), common.optimizer()
    params = eqx.filter(model, eqx.is_inexact_array)
    ls.save_checkpoint(tmp_path / "checkpoints", 0, model=model, opt_state=opt.init(params))
    kw = dict(steps=2, key=jr.key(3), progress=False)
    resumed = ls.train(model, opt, common.loss_fn, data[:2], out_dir=tmp_path, **kw)
    fresh = ls.train(model, opt, common.loss_fn, data[:2], **kw)
    assert resumed.resumed_from == 0
    assert jr.key_data(resumed.key).tolist() == jr.key_data(jr.key(3)).tolist()
    assert eqx.tree_equal(resumed.model, fresh.model)


def test_train_bad_input(data, tmp_path):
    args = (common.make_model(), common.optimizer(), common.loss_fn, data)
    with pytest.raises(ValueError, match=r"steps must be an integer >= 0, got steps=-1"):
        ls.train(*args, steps=-1, key=jr.key(0))
    with pytest.raises(ValueError, match=r"unit must be one of .* got unit='bytes'"):
        ls.train(*args, steps=1, key=jr.key(0), unit="bytes")
    with pytest.raises(ValueError, match=r"checkpoint_every=5 needs out_dir"):
        ls.train(*args, steps=1, key=jr.key(0), checkpoint_every=5)
    with pytest.raises(ValueError, match=r"eval_every=5 needs eval_data"):
        ls.train(*args, steps=1, key=jr.key(0), eval_every=5)
    # Evaluation options without eval_data were ignored in silence.
    with pytest.raises(ValueError, match=r"eval_batches=2 needs eval_data"):
        ls.train(*args, steps=1, key=jr.key(0), eval_batches=2)
    with pytest.raises(ValueError, match=r"eval_fn needs eval_data"):
        ls.train(*args, steps=1, key=jr.key(0), eval_fn=common.loss_fn)
    with pytest.raises(ValueError, match=r"log_every=0"):
        ls.train(*args, steps=1, key=jr.key(0), log_every=0)
    # Checked before any step runs.
    with pytest.raises(ValueError, match=r"keep_checkpoints=0"):
        ls.train(*args, steps=1, key=jr.key(0), out_dir=tmp_path / "k", keep_checkpoints=0)
    with pytest.raises(ValueError, match=r"eval_data must be re-iterable .* generator"):
        ls.train(*args, steps=1, key=jr.key(0), eval_data=(b for b in data))
    # num_epochs=None, also behind worker processes; checked up front (before steps=0's
    # evaluation).
    for forever in (_grain_batches(data), _grain_batches(data, num_workers=2)):
        with pytest.raises(ValueError, match=r"eval_data repeats forever .* eval_batches=None"):
            ls.train(*args, steps=0, key=jr.key(0), eval_data=forever)
    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    with pytest.raises(ValueError, match=r"mesh must have the axes \('data', 'model'\)"):
        ls.train(*args, steps=1, key=jr.key(0), mesh=mesh)
    with pytest.raises(ValueError, match=r"mesh must have the axes \('data', 'model'\)"):
        ls.make_train_step(common.loss_fn, common.optimizer(), mesh=mesh)  # not at step 1
    # An optimiser state of another optimiser or model: optax's own error named neither.
    params = eqx.filter(args[0], eqx.is_inexact_array)
    wider = eqx.filter(eqx.nn.MLP(4, 2, 9, 2, key=jr.key(0)), eqx.is_inexact_array)
    for state, problem in (
        (optax.sgd(0.1).init(params), r"it lacks the leaf opt_state\["),
        (common.optimizer().init(wider), r"opt_state\[.*weight has shape \(9, 4\), not \(8, 4\)"),
    ):
        with pytest.raises(ValueError, match=r"opt_state does not fit .* but " + problem):
            ls.train(*args, steps=1, key=jr.key(0), opt_state=state, progress=False)
    # A state with a leaf that is not an array (the step passes it through) fits.
    named = optax.GradientTransformation(lambda p: {"name": "x"}, lambda u, s, p=None: (u, s))
    chained = optax.chain(common.optimizer(), named)
    state = chained.init(params)
    ls.train(args[0], chained, common.loss_fn, data, steps=1, key=jr.key(0), opt_state=state)
    scalar_loss = lambda model, batch, key: common.loss_fn(model, batch, key)[0]
    with pytest.raises(ValueError, match=r"loss_fn must return a pair \(loss, aux\).*shape \(\)"):
        ls.train(args[0], args[1], scalar_loss, data, steps=1, key=jr.key(0), progress=False)
    # Named before the gradient's own error ("Gradient only defined for scalar-output").
    vector_loss = lambda model, batch, key: (jax.vmap(model)(batch[0]).sum(-1), None)
    with pytest.raises(ValueError, match=r"loss_fn: the loss has shape \(8,\); it must be a"):
        ls.train(args[0], args[1], vector_loss, data, steps=1, key=jr.key(0), progress=False)
    int_loss = lambda model, batch, key: (jnp.sum(batch[1] > 0), None)  # (grad's error)
    with pytest.raises(ValueError, match=r"loss_fn: the loss has dtype int32; it must be a"):
        ls.train(args[0], args[1], int_loss, data, steps=1, key=jr.key(0), progress=False)
    # Evaluated, not differentiated: an integer count is a fine evaluation loss.
    ls.train(*args, steps=1, key=jr.key(0), eval_data=data[:1], eval_fn=int_loss, progress=False)
    # An out_dir that is a file (it was a bare FileExistsError).
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"out_dir=.*file' is a file, not a directory"):
        ls.train(*args, steps=1, key=jr.key(0), out_dir=tmp_path / "file", progress=False)
    old = '{"step": 3, "split": "train", "loss": 1.0}\n'
    (tmp_path / "metrics.jsonl").write_text(old)
    with pytest.raises(ValueError, match=r"already holds a run .* resume=False"):
        ls.train(*args, steps=1, key=jr.key(0), out_dir=tmp_path, resume=False)
    assert (tmp_path / "metrics.jsonl").read_text() == old  # nothing lost
    # Resuming a run that has metrics but no checkpoint restarts, keeping the old metrics.
    with pytest.warns(UserWarning, match=r"metrics but no checkpoint: starting from step 0"):
        ls.train(*args, steps=1, key=jr.key(0), out_dir=tmp_path, progress=False)
    assert (tmp_path / "metrics.jsonl.prev").read_text() == old
    # A third run does not overwrite the first run's metrics (it replaced `.prev`).
    second = (tmp_path / "metrics.jsonl").read_text()
    with pytest.warns(UserWarning, match=r"moved to .*metrics.jsonl.prev.1"):
        ls.train(*args, steps=1, key=jr.key(0), out_dir=tmp_path, progress=False)
    assert (tmp_path / "metrics.jsonl.prev").read_text() == old
    assert (tmp_path / "metrics.jsonl.prev.1").read_text() == second


def test_train_finds_bad_eval_and_data_before_training(data, tmp_path, no_jaxtyping):
    """A failing eval_fn or an empty eval_data was found at the final evaluation, after
    the whole run, which then wrote no final checkpoint; a batch passed as `data`
    failed inside loss_fn, and non-numeric metrics at the first record."""
    args = (common.make_model(), common.optimizer(), common.loss_fn)
    run = dict(steps=4, key=jr.key(0), out_dir=tmp_path, checkpoint_every=1, progress=False)
    broken = lambda model, batch, key: (batch["inputs"].sum(), None)
    with pytest.raises((KeyError, TypeError, IndexError)):
        ls.train(*args, data, eval_data=data[:1], eval_fn=broken, **run)
    with pytest.raises(ValueError, match="eval_data yielded no batches"):
        ls.train(*args, data, eval_data=[], **run)
    assert ls.list_checkpoints(tmp_path) == []  # nothing trained
    assert not (tmp_path / "metrics.jsonl").exists()  # nor a run's metrics begun
    with pytest.raises(TypeError, match=r"got a single batch \(a dict with keys \['x'\]\)"):
        ls.train(*args, {"x": np.zeros((8, 4))}, steps=1, key=jr.key(0))
    with pytest.raises(TypeError, match="data must be an iterable of batches .* got data=None"):
        ls.train(*args, None, steps=1, key=jr.key(0))
    with pytest.raises(TypeError, match="out_dir must be a path .* got out_dir=123"):
        ls.train(*args, data, steps=1, key=jr.key(0), out_dir=123)

    def nested(model, batch, key):
        loss, _ = common.loss_fn(model, batch, key)
        return loss, {"group": {"acc": loss}}

    with pytest.raises(ValueError, match=r"aux metric 'group' is \{'acc'.*scalar numbers"):
        ls.train(args[0], args[1], nested, data, steps=1, key=jr.key(0), progress=False)


def test_throughput_excludes_the_records_own_work(data, monkeypatch):
    """The window restarted before the schedule, the record and the callback ran, so their
    time (a compiling schedule, a slow callback) was charged to the next train steps."""
    clock = [0.0]

    def perf_counter():  # a fake clock: 1 ms per reading
        clock[0] += 1e-3
        return clock[0]

    monkeypatch.setattr(_train.time, "perf_counter", perf_counter)
    slow = lambda step, model, record: clock.__setitem__(0, clock[0] + 100.0)  # 100 s
    result = ls.train(
        common.make_model(), common.optimizer(), common.loss_fn, data[:8], steps=8,
        key=jr.key(0), log_every=2, callback=slow, progress=False,
    )  # fmt: skip
    rates = [r["samples_per_s"] for r in result.history if "samples_per_s" in r]
    # 16 samples per record in a few (fake) ms, not over the callback's 100 s.
    assert len(rates) == 4 and min(rates) > 100, rates


# ------------------------------------------------------------------ checkpoints


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Three checkpoints of a model + optimiser state, keep=2."""
    directory = tmp_path_factory.mktemp("ckpts")
    model = common.make_model()
    opt_state = _opt_state(model)
    state = {"grain": {"next_index": 7, "blob": b"\x00\xff"}, "arr": np.arange(3)}
    for step in (1, 2, 3):
        ls.save_checkpoint(
            directory,
            step,
            model=model,
            opt_state=opt_state,
            key=jr.key(step),
            data_state=state,
            extra={"lr": 0.1},
            keep=2,
        )
    return directory, model, opt_state, state


def test_checkpoint_round_trip_and_pruning(saved):
    directory, model, opt_state, state = saved
    assert [p.name for p in ls.list_checkpoints(directory)] == ["step_00000002", "step_00000003"]
    like = eqx.filter_eval_shape(common.make_model)
    ckpt = ls.load_checkpoint(directory, model=like, opt_state=opt_state)
    assert ckpt.step == 3 and ckpt.extra == {"lr": 0.1}
    assert ckpt.data_state["grain"] == state["grain"]
    np.testing.assert_array_equal(ckpt.data_state["arr"], state["arr"])
    assert jnp.array_equal(jr.key_data(ckpt.key), jr.key_data(jr.key(3)))
    for a, b in zip(_leaves(ckpt.model), _leaves(model), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(jax.tree.leaves(ckpt.opt_state), jax.tree.leaves(opt_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_saving_an_earlier_step_makes_it_the_latest(tmp_path):
    """A run resumed from an earlier checkpoint (e.g. past a corrupt one) abandons the
    later ones: saving drops them, and pruning never drops the checkpoint just written."""
    model = common.make_model()
    for step in (5, 10):
        ls.save_checkpoint(tmp_path, step, model=model)
    path = ls.save_checkpoint(tmp_path, 7, model=model, keep=2)
    names = lambda: [p.name for p in ls.list_checkpoints(tmp_path)]
    assert names() == ["step_00000005", "step_00000007"] and path.name == "step_00000007"
    ls.save_checkpoint(tmp_path, 8, model=model, keep=2)
    assert names() == ["step_00000007", "step_00000008"]
    ls.save_checkpoint(tmp_path, 6, model=model, keep=1)
    assert names() == ["step_00000006"]


def test_save_checkpoint_bad_input(tmp_path):
    model = common.make_model()
    save = ls.save_checkpoint.__wrapped__  # as called without jaxtyping's import hook
    with pytest.raises(ValueError, match="step must be an integer >= 0, got step=1.5"):
        save(tmp_path, 1.5, model=model)
    # Not one key (a batch of keys, floats): saved, these failed only at resume.
    for bad, got in (
        (3, "3"),
        (jr.split(jr.key(0)), r"dtype key<fry>, shape \(2,\)"),
        (np.zeros(2, np.float32), r"dtype float32, shape \(2,\)"),
        (jr.split(jr.PRNGKey(0)), r"dtype uint32, shape \(2, 2\)"),
    ):
        with pytest.raises(ValueError, match=f"key must be one jax.random.key .*, got {got}"):
            save(tmp_path, 1, model=model, key=bad)
    assert not any(tmp_path.iterdir())  # nothing written
    with pytest.raises(ValueError, match="extra must be JSON-compatible"):
        ls.save_checkpoint(tmp_path, 1, model=model, extra={"f": object()})
    for bad in (3, [1, 2], "cfg", 0):  # a save that no load could read back
        with pytest.raises(
            TypeError, match=f"extra must be a dict .*, got extra={re.escape(repr(bad))}"
        ):
            save(tmp_path, 1, model=model, extra=bad)
    assert list(tmp_path.iterdir()) == []  # nothing written
    (tmp_path / "file").write_text("x")  # (a bare FileExistsError)
    with pytest.raises(ValueError, match=r"directory=.*file' is a file, not a checkpoint"):
        save(tmp_path / "file", 1, model=model)
    (tmp_path / "file").unlink()
    # pathlib's own error named neither the argument nor its value (without jaxtyping's
    # import hook, which names the parameter itself).
    unwrap = inspect.unwrap
    for call, name in (
        (lambda: save(None, 1, model=model), "directory"),
        (lambda: unwrap(ls.load_checkpoint)(None, model=model), "path"),
        (lambda: unwrap(ls.load_latest_checkpoint)(3, model=model), "directory"),
        (lambda: unwrap(ls.list_checkpoints)(3), "directory"),
    ):
        with pytest.raises(TypeError, match=f"{name} must be a path .*, got {name}="):
            call()


def test_checkpoint_names_changed_static_fields_and_reads_a_run_dir(tmp_path):
    """A model with another window (nothing the arrays record) loaded without a word, and
    a `train` run's `out_dir` looked like a directory without checkpoints."""
    lm = lambda window: ls.BlockStateTransformerLM.from_variant(
        "SLIDE", 17, dim=8, num_layers=1, num_heads=2, window=window, key=jr.key(0)
    )
    ls.save_checkpoint(tmp_path / "checkpoints", 3, model=lm(4))
    assert ls.list_checkpoints(tmp_path) == ls.list_checkpoints(tmp_path / "checkpoints") != []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ls.load_checkpoint(tmp_path, model=lm(4)).step == 3
    with pytest.warns(UserWarning, match=r"\.window: 4 in the checkpoint, 8 given") as caught:
        assert ls.load_latest_checkpoint(tmp_path, model=lm(8)).step == 3
    assert len(caught) == 1  # one warning, naming every field that differs


def test_checkpoint_keeps_the_python_numbers_given(tmp_path):
    """Python numbers (here `Dropout.p`) are not arrays: the template's are kept, as its
    static fields are, and a warning names those that differ (they were replaced by the
    saved ones without a word); `inference` flags are the caller's business."""
    model = lambda p: eqx.nn.Dropout(p)
    ls.save_checkpoint(tmp_path, 1, model=model(0.5))
    with pytest.warns(UserWarning, match=r"model\.p: 0\.5 in the checkpoint, 0\.1 given"):
        assert ls.load_checkpoint(tmp_path, model=model(0.1)).model.p == 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = ls.load_checkpoint(tmp_path, model=eqx.nn.inference_mode(model(0.5))).model
    assert loaded.inference is True and loaded.p == 0.5
    ls.save_checkpoint(tmp_path / "nan", 1, model=model(float("nan")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NaN given, NaN saved: the same
        ls.load_checkpoint(tmp_path / "nan", model=model(float("nan")))


def test_checkpoint_of_model_only_round_trips(tmp_path):
    model = common.make_model()
    ls.save_checkpoint(tmp_path, 0, model=model)
    ckpt = ls.load_checkpoint(tmp_path, model=eqx.filter_eval_shape(common.make_model))
    assert ckpt.key is None and ckpt.opt_state is None and ckpt.step == 0
    for a, b in zip(_leaves(ckpt.model), _leaves(model), strict=True):
        np.testing.assert_array_equal(a, b)


def test_checkpoint_loads_the_model_without_its_optimiser_state(saved, tmp_path):
    """`opt_state=None` loads the model alone, skipping a saved optimiser state (it was
    a mismatch error, so inference needed an optimiser state to load weights), whatever
    that state holds: arrays, Python scalars, typed PRNG keys."""
    directory, model, opt_state, _ = saved
    like = eqx.filter_eval_shape(common.make_model)
    odd = {"adam": opt_state, "count": 3, "scale": 0.5, "flag": True, "key": jr.key(1)}
    ls.save_checkpoint(tmp_path, 4, model=model, opt_state=odd, key=jr.key(2))
    for where in (directory, tmp_path):
        ckpt = ls.load_checkpoint(where, model=like)
        assert ckpt.opt_state is None
        for a, b in zip(_leaves(ckpt.model), _leaves(model), strict=True):
            np.testing.assert_array_equal(a, b)
    assert jnp.array_equal(jr.key_data(ckpt.key), jr.key_data(jr.key(2)))
    assert ls.load_latest_checkpoint(tmp_path, model=like).step == 4
    # With a template, the state still round-trips (and a wrong template is still named).
    template = {**jax.tree.map(jnp.zeros_like, odd), "count": 0, "scale": 0.0, "flag": False}
    full = ls.load_checkpoint(tmp_path, model=like, opt_state=template)
    for a, b in zip(
        jax.tree.leaves(full.opt_state["adam"]), jax.tree.leaves(opt_state), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    assert (full.opt_state["count"], full.opt_state["scale"], full.opt_state["flag"]) == (
        3,
        0.5,
        True,
    )
    with pytest.raises(ls.CheckpointError, match="does not match the model/optimiser"):
        ls.load_checkpoint(tmp_path, model=like, opt_state=opt_state)


def test_truncated_checkpoint_is_reported_and_previous_loads(saved, tmp_path):
    src, model, opt_state, _ = saved
    directory = tmp_path / "c"
    shutil.copytree(src, directory)
    arrays = directory / "step_00000003/arrays.eqx"
    arrays.write_bytes(arrays.read_bytes()[:-10])
    with pytest.raises(ls.CheckpointError, match=rf"{arrays}.* truncated or corrupt"):
        ls.load_checkpoint(directory / "step_00000003", model=model, opt_state=opt_state)
    with pytest.warns(UserWarning, match="Skipping checkpoint"):
        ckpt = ls.load_latest_checkpoint(directory, model=model, opt_state=opt_state)
    assert ckpt.step == 2
    manifest = directory / "step_00000002/manifest.json"
    manifest.write_text(manifest.read_text()[:50])
    with pytest.raises(ls.CheckpointError, match=rf"{manifest} is truncated or corrupt"):
        ls.load_checkpoint(directory / "step_00000002", model=model, opt_state=opt_state)
    for broken in ("[]", '{"format": 1}'):  # valid JSON, not a manifest
        manifest.write_text(broken)
        with pytest.raises(ls.CheckpointError, match=rf"{manifest} is corrupt: expected"):
            ls.load_checkpoint(directory / "step_00000002", model=model, opt_state=opt_state)


def test_grad_norm_is_the_global_norm_before_clipping():
    """`metrics["grad_norm"]` is the gradient's global L2 norm, taken before clipping."""
    loss = lambda model, batch, key: (jnp.sum(model["w"] * batch), None)
    opt = ls.make_optimizer(0.1, clip_norm=1.0)
    step = ls.make_train_step(loss, opt, donate=False)
    model = {"w": jnp.ones(3)}
    _, _, metrics = step(model, opt.init(model), jnp.array([3.0, 4.0, 12.0]), jr.key(0))
    assert float(metrics["grad_norm"]) == pytest.approx(13.0)


def test_flipped_bit_is_caught_by_the_checksum(saved, tmp_path):
    """Corruption that keeps the file's size (one bit flipped) is caught by its SHA-256:
    the step is refused by name, and the latest loadable one loads instead."""
    src, model, opt_state, _ = saved
    directory = tmp_path / "c"
    shutil.copytree(src, directory)
    arrays = directory / "step_00000003/arrays.eqx"
    data = bytearray(arrays.read_bytes())
    data[len(data) // 2] ^= 1
    arrays.write_bytes(bytes(data))
    with pytest.raises(ls.CheckpointError, match=rf"{arrays} is corrupt: its SHA-256"):
        ls.load_checkpoint(directory / "step_00000003", model=model, opt_state=opt_state)
    with pytest.warns(UserWarning, match="Skipping checkpoint"):
        ckpt = ls.load_latest_checkpoint(directory, model=model, opt_state=opt_state)
    assert ckpt.step == 2


def test_mismatched_model_shape_is_reported(saved, tmp_path):
    directory, _, _, _ = saved
    other = eqx.nn.MLP(4, 2, 16, 2, key=jr.key(0))  # width 16 instead of 8
    with pytest.raises(
        ls.CheckpointError,
        match=r"manifest.json does not match .* leaf \['model'\]\.layers\[0\]\.weight has "
        r"shape \(8, 4\) .* in the checkpoint but shape \(16, 4\)",
    ):
        ls.load_checkpoint(directory, model=other, opt_state=_opt_state(other))
    # train() refuses to resume into a different model, and leaves the run untouched.
    run = tmp_path / "run"
    shutil.copytree(directory, run / "checkpoints")
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    with pytest.raises(ls.CheckpointError, match=r"does not match"):
        ls.train(
            other,
            common.optimizer(),
            common.loss_fn,
            common.batches(2),
            steps=2,
            key=jr.key(0),
            out_dir=run,
            progress=False,
        )
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
    with pytest.raises(ls.CheckpointError, match=r"No checkpoint .* found in"):
        ls.load_checkpoint(tmp_path, model=other)


def test_interrupted_save_leaves_previous_intact(saved, tmp_path, monkeypatch):
    src, model, opt_state, _ = saved
    directory = tmp_path / "c"
    shutil.copytree(src, directory)

    def crash(path):
        raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(_checkpoint, "_fsync_dir", crash)
    with pytest.raises(KeyboardInterrupt):
        ls.save_checkpoint(directory, 4, model=model, opt_state=opt_state, keep=2)
    monkeypatch.undo()
    assert [p.name for p in ls.list_checkpoints(directory)] == ["step_00000002", "step_00000003"]
    assert ls.load_latest_checkpoint(directory, model=model, opt_state=opt_state).step == 3
    ls.save_checkpoint(directory, 4, model=model, opt_state=opt_state, keep=2)
    names = sorted(p.name for p in directory.iterdir())
    assert names == ["step_00000003", "step_00000004"]  # the leftover temp dir is gone


def test_plot_metrics_from_file(full_run):
    out, _ = full_run
    fig = ls.plot_metrics(out / "metrics.jsonl", keys=("loss",))
    assert len(fig.axes) == 1
    with pytest.raises(ValueError, match="no metrics"):
        ls.plot_metrics([])
    assert pathlib.Path(out / "curves.png").exists()


def test_plot_metrics_leaves_pyplot_alone(full_run, tmp_path):
    """Saving a plot neither switches matplotlib's backend (it forced Agg on every
    caller: a notebook's inline backend was gone after `train(plot=True)`) nor leaves a
    figure open in pyplot; without a path, the figure is pyplot's, for `plt.show()`."""
    import matplotlib
    import matplotlib.pyplot as plt

    _, result = full_run
    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        figures = plt.get_fignums()
        ls.plot_metrics(result.history, tmp_path / "curves.png")
        assert (tmp_path / "curves.png").stat().st_size > 1000
        assert matplotlib.get_backend() == "svg"
        assert plt.get_fignums() == figures
        shown = ls.plot_metrics(result.history)
        assert plt.get_fignums() == [*figures, shown.number]
        plt.close(shown)
    finally:
        matplotlib.use(before)


def test_train_integer_arguments(data, tmp_path):
    args = (common.make_model(), common.optimizer(), common.loss_fn, data)
    result = ls.train(
        *args, steps=np.int64(2), key=jr.key(0), log_every=np.int64(1), progress=False
    )
    assert result.step == 2 and [r["step"] for r in result.history] == [1, 2]
    with pytest.raises(ValueError, match="steps must be an integer >= 0, got steps=True"):
        ls.train(*args, steps=True, key=jr.key(0))
    # Without jaxtyping's import hook (which rejects these by the annotations first).
    train = inspect.unwrap(ls.train)
    for bad in ("2", 1.5, True, 0):
        with pytest.raises(
            ValueError,
            match=f"eval_batches must be None or a positive integer, got eval_batches={bad!r}",
        ):
            train(*args, steps=1, key=jr.key(0), eval_data=data, eval_batches=bad)
    for bad, got in ((0, "key=0"), (jnp.zeros(2), "an array of shape \\(2,\\) and dtype float32")):
        with pytest.raises(TypeError, match=f"key must be one JAX PRNG key, .*got {got}"):
            train(*args, steps=1, key=bad)


def test_plot_metrics_unknown_key(full_run):
    _, result = full_run
    with pytest.raises(
        ValueError, match=r"no record has the metric 'acc'; the history has \['loss'"
    ):
        ls.plot_metrics(result.history, keys=("loss", "acc"))
    figure = ls.plot_metrics(result.history, keys="max_err")  # a name, not its letters
    assert len(figure.axes) == 1


def test_plot_metrics_bad_records_and_path(full_run, tmp_path):
    """Records without a split drew empty panels, and a directory as `path` saved the
    figure beside it as `<dir>.png`: both are errors now, and nothing is written."""
    _, result = full_run
    with pytest.raises(
        ValueError, match=r"history\[1\] needs a 'step' and a 'split'.*\['loss', 'step'\]"
    ):
        ls.plot_metrics([{"step": 1, "split": "train", "loss": 1.0}, {"step": 2, "loss": 0.5}])
    with pytest.raises(ValueError, match=f"path='{tmp_path}' is a directory; expected a file"):
        ls.plot_metrics(result.history, tmp_path)
    assert list(tmp_path.parent.glob(f"{tmp_path.name}*")) == [tmp_path]
    assert not any(tmp_path.iterdir())
    plot = inspect.unwrap(ls.plot_metrics)  # as called without jaxtyping's import hook
    with pytest.raises(TypeError, match="keys must be a metric name or a tuple of them"):
        plot(result.history, keys=3)
    with pytest.raises(TypeError, match="history must be a path .* got history=None"):
        plot(None)


class _Noisy(eqx.Module):
    """A model holding a typed PRNG key (for fixed noise) among its leaves."""

    mlp: eqx.nn.MLP
    noise_key: jax.Array

    def __call__(self, x):
        return self.mlp(x) + 0.01 * jr.normal(self.noise_key, (2,))


def _noisy(impl="rbg"):
    return _Noisy(common.make_model(), jr.key(5, impl=impl))


def test_typed_prng_key_leaves_round_trip(tmp_path):
    model = _noisy()
    ls.save_checkpoint(tmp_path, 1, model=model, key=jr.key(2))
    for like in (model, eqx.filter_eval_shape(_noisy)):
        ckpt = ls.load_checkpoint(tmp_path, model=like)
        assert str(jr.key_impl(ckpt.model.noise_key)) == "rbg"
        np.testing.assert_array_equal(
            jr.key_data(ckpt.model.noise_key), jr.key_data(model.noise_key)
        )
        np.testing.assert_array_equal(jr.key_data(ckpt.key), jr.key_data(jr.key(2)))
    with pytest.raises(
        ls.CheckpointError,
        match=r"leaf \['model'\]\.noise_key is a rbg PRNG key in "
        r"the checkpoint but a threefry2x32 PRNG key",
    ):
        ls.load_checkpoint(tmp_path, model=_noisy("threefry2x32"))


def test_typed_prng_key_leaves_resume(tmp_path, data):
    kw = dict(key=jr.key(0), log_every=2, checkpoint_every=2, progress=False)
    args = (common.optimizer(), common.loss_fn, data)
    full = ls.train(_noisy(), *args, steps=6, out_dir=tmp_path / "full", **kw)
    ls.train(_noisy(), *args, steps=4, out_dir=tmp_path / "part", **kw)
    resumed = ls.train(_noisy(), *args, steps=6, out_dir=tmp_path / "part", **kw)
    assert resumed.resumed_from == 4
    losses = lambda h: [(r["step"], r["loss"]) for r in h]
    assert losses(resumed.history) == losses(full.history)
    np.testing.assert_array_equal(
        jr.key_data(resumed.model.noise_key), jr.key_data(jr.key(5, impl="rbg"))
    )


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda m: m.pop("key_impl"), "field 'key_impl' .* missing"),
        (lambda m: m.pop("data_state"), "field 'data_state' .* missing"),
        (lambda m: m.update(step="two"), "field 'step' to be an integer >= 0, got 'two'"),
        (lambda m: m.update(leaves="x"), "field 'leaves' to be a list"),
        (lambda m: m.update(leaves=[{"path": "x"}]), "field 'leaves' to be a list"),
        (lambda m: m.update(arrays="../arrays.eqx"), "field 'arrays' to be a file name"),
        (lambda m: m.update(key_impl="nope"), "field 'key_impl' to be null or a PRNG"),
        (
            lambda m: m.update(data_state={"__ndarray__": [1], "dtype": "nope"}),
            "field 'data_state'",
        ),
    ],
)
def test_damaged_manifest_is_a_checkpoint_error(saved, tmp_path, damage, message):
    src, model, opt_state, _ = saved
    directory = tmp_path / "c"
    shutil.copytree(src, directory)
    path = directory / "step_00000003/manifest.json"
    manifest = json.loads(path.read_text())
    damage(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(ls.CheckpointError, match=rf"{path} is corrupt: expected {message}"):
        ls.load_checkpoint(path.parent, model=model, opt_state=opt_state)
    with pytest.warns(UserWarning, match="Skipping checkpoint"):  # as train(resume=True) does
        assert ls.load_latest_checkpoint(directory, model=model, opt_state=opt_state).step == 2


@pytest.mark.parametrize(
    "name", ["grad_norm", "step", "split", "lr", "samples_per_s", "tokens_per_s"]
)
def test_aux_metrics_may_not_take_the_names_the_loop_records(name):
    """An aux metric named like a field of the train loop's records overwrote the
    record's step or split (breaking resume's rewind and the plots), or was overwritten
    by the loop's own grad_norm / lr / throughput without a word."""
    batch = np.ones((4, 3), np.float32)
    loss_fn = lambda w, b, key: (jnp.mean((b @ w) ** 2), {name: jnp.asarray(7.0)})
    step = ls.make_train_step(loss_fn, ls.make_optimizer(1e-2), donate=False)
    model = jnp.ones(3)
    with pytest.raises(ValueError, match=f"loss_fn: aux metric name '{name}' is reserved"):
        step(model, ls.make_optimizer(1e-2).init(model), batch, jr.key(0))
    with pytest.raises(ValueError, match=f"eval_fn: aux metric name '{name}' is reserved"):
        ls.make_eval_step(loss_fn)(model, batch, jr.key(0))


def test_a_donated_model_given_again_is_named():
    """The step donates the model's and optimiser state's buffers: passing the old ones
    again was XLA's "Buffer has been deleted or donated", naming neither."""
    batch = np.ones((4, 3), np.float32)
    loss_fn = lambda w, b, key: (jnp.mean((b @ w) ** 2), None)
    opt = ls.make_optimizer(1e-2)
    step = ls.make_train_step(loss_fn, opt)
    model = jnp.ones(3)
    state = opt.init(model)
    new_model, new_state, _ = step(model, state, batch, jr.key(0))
    with pytest.raises(ValueError, match="already donated to a train step.*donate=False"):
        step(model, state, batch, jr.key(0))
    step(new_model, new_state, batch, jr.key(0))  # the returned ones go on
