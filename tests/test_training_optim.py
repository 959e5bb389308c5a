"""Optimisers: schedules, parameter groups, clipping and accumulation against optax oracles."""

import inspect
import math
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
import pytest

import lineax_seq as ls


class Toy(eqx.Module):
    encoder: eqx.nn.Linear
    dynamics: jax.Array
    count: jax.Array  # integer leaf: never optimised
    name: str = eqx.field(static=True)

    def __init__(self, key):
        self.encoder = eqx.nn.Linear(3, 2, key=key)
        self.dynamics = jnp.arange(4.0).reshape(2, 2)
        self.count = jnp.array(3)
        self.name = "toy"


def _params(model):
    return eqx.filter(model, eqx.is_inexact_array)


def _grads(model, seed):
    leaves, treedef = jax.tree.flatten(_params(model))
    keys = jr.split(jr.key(seed), len(leaves))
    noise = [jr.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)]
    return jax.tree.unflatten(treedef, noise)


def _update(opt, model, grads_seq):
    params = _params(model)
    state = opt.init(params)
    update = jax.jit(opt.update)
    out = []
    for g in grads_seq:
        u, state = update(g, state, params)
        out.append(u)
    return out


def _assert_tree_close(a, b, **kw):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **kw)


@pytest.fixture(scope="module")
def toy():
    return Toy(jr.key(0))


def test_schedules_values():
    cos = ls.make_schedule(1.0, schedule="cosine", warmup_steps=10, total_steps=110, end_lr=0.1)
    assert float(cos(0)) == 0.0
    assert math.isclose(float(cos(5)), 0.5, rel_tol=1e-6)
    assert math.isclose(float(cos(10)), 1.0, rel_tol=1e-6)
    assert math.isclose(float(cos(60)), 0.1 + 0.9 * 0.5, rel_tol=1e-5)  # half way
    assert math.isclose(float(cos(110)), 0.1, rel_tol=1e-5)
    lin = ls.make_schedule(2.0, schedule="linear", warmup_steps=4, total_steps=14)
    assert [round(float(lin(s)), 5) for s in (0, 2, 4, 9, 14, 20)] == [0, 1, 2, 1, 0, 0]
    const = ls.make_schedule(3.0, schedule="constant", warmup_steps=3)
    assert [round(float(const(s)), 5) for s in (0, 3, 1000)] == [0, 3, 3]
    assert float(ls.make_schedule(3.0, schedule="constant")(0)) == 3.0


def test_schedule_bad_input():
    with pytest.raises(ValueError, match=r"schedule must be one of .* got schedule='cosin'"):
        ls.make_schedule(1.0, schedule="cosin", total_steps=10)
    with pytest.raises(ValueError, match=r"total_steps=None"):
        ls.make_schedule(1.0, schedule="linear")
    with pytest.raises(ValueError, match=r"total_steps=5 must be an integer > warmup_steps=5"):
        ls.make_schedule(1.0, warmup_steps=5, total_steps=5)
    with pytest.raises(ValueError, match=r"schedule='step'"):
        ls.make_optimizer(1e-3, schedule="step")
    # A final learning rate that a constant schedule would ignore (it did, silently).
    with pytest.raises(ValueError, match=r"end_lr=0.5 has no effect .*decaying schedule"):
        ls.make_schedule(1.0, end_lr=0.5)
    with pytest.raises(ValueError, match=r"end_lr_ratio=0.5 has no effect .*decaying schedule"):
        ls.make_optimizer(1e-3, end_lr_ratio=0.5)
    assert float(ls.make_optimizer(1e-3, end_lr_ratio=1.0).learning_rate_schedule(9)) == 1e-3
    # A warmup or a decay the wrong way round was accepted (the "decay" rose).
    with pytest.raises(ValueError, match=r"end_lr=0.002 must be <= peak_lr=0.001 .* decay"):
        ls.make_schedule(1e-3, total_steps=10, end_lr=2e-3)
    with pytest.raises(ValueError, match=r"init_lr=0.01 must be <= peak_lr=0.001 .* warm up"):
        ls.make_schedule(1e-3, warmup_steps=2, init_lr=1e-2)


def test_param_labels(toy):
    groups = {
        "dyn": ls.ParamGroup(where=lambda m: m.dynamics, learning_rate=1e-5),
        "bias": ls.ParamGroup(match=r"\.bias$"),
        "weights": ls.ParamGroup(match=lambda path, leaf: leaf.ndim == 2),
    }
    labels = ls.param_labels(toy, groups)
    assert labels.dynamics == "dyn"  # first matching group wins over "weights"
    assert labels.encoder.bias == "bias"
    assert labels.encoder.weight == "weights"
    assert labels.count is None  # integer leaves are not optimised
    for group in (
        ls.ParamGroup(where=lambda m: m.encoder),
        ls.ParamGroup(instance_of=eqx.nn.Linear),
    ):
        labels = ls.param_labels(toy, {"enc": group})
        assert (labels.encoder.weight, labels.encoder.bias, labels.dynamics) == (
            "enc",
            "enc",
            "default",
        )
    # A compiled pattern, flags included, as a string pattern.
    labels = ls.param_labels(toy, {"b": ls.ParamGroup(match=re.compile(r"\.BIAS$", re.I))})
    assert (labels.encoder.bias, labels.encoder.weight) == ("b", "default")


def test_param_group_bad_input(toy):
    with pytest.raises(ValueError, match="exactly one of `match`"):
        ls.ParamGroup()
    with pytest.raises(ValueError, match="exactly one of `match`"):
        ls.ParamGroup(match="a", where=lambda m: m)
    with pytest.raises(ValueError, match=r"learning_rate=-1"):
        ls.ParamGroup(match="a", learning_rate=-1)
    with pytest.raises(ValueError, match="'default' is reserved"):
        ls.make_optimizer(groups={"default": ls.ParamGroup(match="a")})
    with pytest.raises(ValueError, match=r"groups\['x'\].where could not select"):
        ls.param_labels(toy, {"x": ls.ParamGroup(where=lambda m: m.missing)})
    with pytest.raises(ValueError, match=r"accumulate_steps=0"):
        ls.make_optimizer(accumulate_steps=0)
    with pytest.raises(ValueError, match=r"clip_norm=0"):
        ls.make_optimizer(clip_norm=0)
    # Bad groups fail where they are made, naming the field.
    with pytest.raises(ValueError, match=r"match='\(' is not a regular expression"):
        ls.ParamGroup(match="(")
    # (Under jaxtyping's import hook the annotations catch these first.)
    with pytest.raises((ValueError, TypeError), match="match"):
        ls.ParamGroup(match=3)
    with pytest.raises((ValueError, TypeError), match="instance_of"):
        ls.ParamGroup(instance_of="Linear")
    with pytest.raises((ValueError, TypeError), match="groups"):
        ls.make_optimizer(groups=[ls.ParamGroup(match="a")])
    with pytest.raises((ValueError, TypeError), match="must be strings, got 3|parameter .groups"):
        ls.make_optimizer.__wrapped__(groups={3: ls.ParamGroup(match="a")})
    # A predicate that fails is named with the parameter it failed on.
    broken = ls.ParamGroup(match=lambda path, leaf: leaf.missing)
    with pytest.raises(ValueError, match=r"groups\['p'\].match raised AttributeError: .* on the"):
        ls.param_labels(toy, {"p": broken})
    for name, value in (("b1", 2.0), ("b2", -0.1), ("eps", -1)):
        with pytest.raises(ValueError, match=f"{name}={value}"):
            ls.make_optimizer(total_steps=10, **{name: value})
    nan, inf = float("nan"), float("inf")
    for name, value in (
        ("learning_rate", nan), ("learning_rate", inf), ("weight_decay", nan),
        ("clip_norm", nan), ("clip_norm", inf), ("eps", inf), ("eps", nan),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=f"{name}={value} must be a finite number"):
            ls.make_optimizer(total_steps=10, **{name: value})
    for name in ("learning_rate", "weight_decay"):
        with pytest.raises(ValueError, match=f"{name}=nan must be a finite number"):
            ls.ParamGroup(match="a", **{name: nan})
    with pytest.raises(ValueError, match="peak_lr=inf must be a finite number"):
        ls.make_schedule(inf, schedule="constant")
    with pytest.raises(ValueError, match="learning_rate='1e-3' must be a number"):
        ls.make_optimizer.__wrapped__("1e-3", total_steps=10)  # as without the hook
    with pytest.raises(
        ValueError, match="total_steps must be a positive integer, got total_steps=10.5"
    ):
        ls.make_schedule.__wrapped__(1.0, total_steps=10.5)
    with pytest.raises(ValueError, match="total_steps must be a positive integer, got total_st"):
        ls.make_schedule.__wrapped__(1.0, schedule="constant", total_steps="x")  # unused, checked
    # Concrete JAX scalars are numbers, as in optax; arrays and bools are not.
    from_jax = ls.make_optimizer.__wrapped__(jnp.float32(0.5), weight_decay=jnp.float32(0.1))
    assert float(from_jax.learning_rate_schedule(3)) == 0.5
    for bad in (jnp.ones(2), jnp.bool_(True)):
        with pytest.raises(ValueError, match=r"learning_rate=Array\(.* must be a number"):
            ls.make_optimizer.__wrapped__(bad)


def test_param_group_predicates_see_shapes_not_values(toy):
    """Labels are recomputed inside `jit` (on the gradients), so a predicate gets the
    leaf's shape and dtype, never its values: the same labels eagerly and jitted."""
    seen = []
    group = ls.ParamGroup(match=lambda path, leaf: seen.append(type(leaf)) or leaf.ndim == 2)
    opt = ls.make_optimizer(1e-2, schedule="constant", groups={"w": group})
    params = eqx.filter(toy, eqx.is_inexact_array)
    state = opt.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    eager, _ = opt.update(grads, state, params)
    jitted, _ = eqx.filter_jit(opt.update)(grads, state, params)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert set(seen) == {jax.ShapeDtypeStruct}


def test_groups_match_separate_adamw(toy):
    """Each group is updated exactly as a plain optax.adamw with its own lr / decay."""
    groups = {
        "dyn": ls.ParamGroup(where=lambda m: m.dynamics, learning_rate=1e-5, weight_decay=0.0)
    }
    kw = dict(schedule="linear", warmup_steps=2, total_steps=10, end_lr_ratio=0.1)
    opt = ls.make_optimizer(1e-3, weight_decay=0.1, clip_norm=None, groups=groups, **kw)
    grads = [_grads(toy, s) for s in range(4)]
    got = _update(opt, toy, grads)

    def oracle(lr, wd, select, **adam):
        sched = optax.join_schedules(
            [optax.linear_schedule(0.0, lr, 2), optax.linear_schedule(lr, 0.1 * lr, 8)], [2]
        )
        tx = optax.adamw(sched, weight_decay=wd, **adam)
        p = select(_params(toy))
        state = tx.init(p)
        update = jax.jit(tx.update)
        outs = []
        with jax.numpy_dtype_promotion("standard"):
            for g in grads:
                u, state = update(select(g), state, p)
                outs.append(u)
        return outs

    dyn = oracle(1e-5, 0.0, lambda t: t.dynamics)
    enc = oracle(1e-3, 0.1, lambda t: t.encoder)
    for u, d, e in zip(got, dyn, enc, strict=True):
        _assert_tree_close(u.dynamics, d, rtol=1e-6, atol=1e-12)
        _assert_tree_close(u.encoder, e, rtol=1e-6, atol=1e-12)
    assert np.abs(np.asarray(got[-1].dynamics)).max() < 1e-4  # tiny lr really applied
    # A group inherits what it leaves at None (its lr alone: the base decay; its decay
    # alone: the base lr), lr = 0 freezes it, and b1, b2, eps reach every group.
    adam = dict(b1=0.5, b2=0.9, eps=1e-4)
    dynamics = lambda m: m.dynamics
    for group, lr, wd in [
        (ls.ParamGroup(where=dynamics, learning_rate=1e-2), 1e-2, 0.1),
        (ls.ParamGroup(where=dynamics, weight_decay=0.5), 2e-3, 0.5),
        (ls.ParamGroup(where=dynamics, learning_rate=0.0), 0.0, 0.1),
    ]:
        opt = ls.make_optimizer(
            2e-3, weight_decay=0.1, clip_norm=None, groups={"dyn": group}, **kw, **adam
        )
        got = _update(opt, toy, grads)
        dyn = oracle(lr, wd, lambda t: t.dynamics, **adam)
        enc = oracle(2e-3, 0.1, lambda t: t.encoder, **adam)
        for u, d, e in zip(got, dyn, enc, strict=True):
            _assert_tree_close(u.dynamics, d, rtol=1e-6, atol=1e-12)
            _assert_tree_close(u.encoder, e, rtol=1e-6, atol=1e-12)


def test_clipping_and_accumulation(toy):
    """Average `accumulate_steps` grads, then clip by the global norm over all groups."""
    kw = dict(schedule="constant", weight_decay=0.0)
    grads = [_grads(toy, s) for s in range(4)]
    clip = 0.5
    got = _update(ls.make_optimizer(1e-2, clip_norm=clip, accumulate_steps=2, **kw), toy, grads)

    def clipped(g):
        norm = jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(g)))
        return jax.tree.map(lambda x: x * jnp.minimum(1.0, clip / norm), g)

    mean = lambda a, b: jax.tree.map(lambda x, y: (x + y) / 2, a, b)
    ref = _update(
        ls.make_optimizer(1e-2, clip_norm=None, **kw),
        toy,
        [clipped(mean(grads[0], grads[1])), clipped(mean(grads[2], grads[3]))],
    )
    assert all(np.all(np.asarray(x) == 0) for x in jax.tree.leaves(got[0]))  # accumulating
    _assert_tree_close(got[1], ref[0], rtol=1e-5, atol=1e-8)
    _assert_tree_close(got[3], ref[1], rtol=1e-5, atol=1e-8)


def test_make_optimizer_defaults_without_total_steps():
    """`make_optimizer(lr)` is AdamW at a constant rate after the warmup; the cosine
    decay is the default only with `total_steps`, and asked for without it, an error."""
    for kw, want in (
        ({}, [1e-3, 1e-3, 1e-3]),
        ({"warmup_steps": 4}, [0.0, 5e-4, 1e-3]),
        ({"total_steps": 8}, [1e-3, 1e-3 * (1 + math.cos(math.pi / 4)) / 2, 0.0]),  # cosine
    ):
        opt = ls.make_optimizer(1e-3, **kw)
        got = [float(opt.learning_rate_schedule(s)) for s in (0, 2, 8)]
        np.testing.assert_allclose(got, want, atol=1e-9)
    params = {"w": jnp.ones(3)}
    opt = ls.make_optimizer(1e-3, weight_decay=0.0, clip_norm=None)
    updates, _ = opt.update({"w": jnp.ones(3)}, opt.init(params), params)
    np.testing.assert_allclose(updates["w"], -1e-3, rtol=1e-4)  # Adam's first step: -lr
    assert float(ls.make_schedule(2.0)(100)) == 2.0
    with pytest.raises(ValueError, match=r"schedule='cosine' decays until total_steps, but "):
        ls.make_optimizer(1e-3, schedule="cosine")


def test_optimizer_integer_and_number_arguments():
    opt = ls.make_optimizer(1e-3, accumulate_steps=np.int64(2), warmup_steps=np.int64(1))
    assert opt.accumulate_steps == 2 and type(opt.accumulate_steps) is int
    for bad in (True, 0, 1.5):
        with pytest.raises(
            ValueError,
            match=f"accumulate_steps must be a positive integer, got accumulate_steps={bad}",
        ):
            inspect.unwrap(ls.make_optimizer)(accumulate_steps=bad)
    for name in ("b1", "b2"):
        with pytest.raises(ValueError, match=f"{name}='0.9' must be a number in \\[0, 1\\)"):
            inspect.unwrap(ls.make_optimizer)(**{name: "0.9"})


def test_param_group_that_selects_nothing_is_an_error(toy):
    for group, message in (
        (
            ls.ParamGroup(match=r"\.dynamic$"),
            r" \(match=.*\) matches no parameter path \(the paths: '.encoder.weight', ",
        ),
        (  # a compiled pattern is a pattern, not a predicate
            ls.ParamGroup(match=re.compile(r"\.dynamic$")),
            r" \(match=re.compile.*\) matches no parameter path \(the paths: '.encoder.weight'",
        ),
        (
            ls.ParamGroup(match=lambda path, leaf: leaf.ndim == 3),
            r" .*is false for every parameter",
        ),
        (
            ls.ParamGroup(where=lambda m: m.count),
            r"\.where selects Array\(3.*which holds no inexact array",
        ),
        (
            ls.ParamGroup(where=lambda m: m.name),
            r"\.where selects 'toy', which holds no inexact array",
        ),
        (
            ls.ParamGroup(instance_of=eqx.nn.MLP),
            r" \(instance_of=.*MLP'>\) selects no inexact array",
        ),
    ):
        with pytest.raises(ValueError, match=r"groups\['typo'\]" + message):
            ls.param_labels(toy, {"typo": group})
    opt = ls.make_optimizer(
        1e-3, groups={"typo": ls.ParamGroup(match="dynamic$", learning_rate=0.1)}
    )
    with pytest.raises(ValueError, match=r"groups\['typo'\] \(match='dynamic\$'\) matches no"):
        opt.init(eqx.filter(toy, eqx.is_inexact_array))
    shadowed = {"all": ls.ParamGroup(match="."), "enc": ls.ParamGroup(where=lambda m: m.encoder)}
    with pytest.raises(
        ValueError,
        match=r"groups\['enc'\] selects only parameters that earlier groups take \('all'",
    ):
        ls.param_labels(toy, shadowed)
