"""The train and eval steps: `loss_fn` checked, gradients, optimiser update, sharding."""

from __future__ import annotations

import functools as ft
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
import optax
from jaxtyping import Array, PRNGKeyArray, PyTree, Scalar

from .._checks import check_bool, check_int, short_repr
from ._sharding import batch_arrays, check_mesh, shard_params

LossFn = Callable[[PyTree, Any, PRNGKeyArray], tuple[Scalar, Mapping[str, Array] | None]]
"""`loss_fn(model, batch, key) -> (loss, aux)`: scalar loss and a dict of scalar metrics."""

UNITS = ("samples", "tokens")
RESERVED_METRICS = ("loss", "grad_norm", "lr", "step", "split") + tuple(f"{u}_per_s" for u in UNITS)
"""Names the train step and the train loop write into every record: no aux metric may
take one (it would overwrite a record's step or split, or be overwritten silently)."""


def _metrics(loss: Scalar, aux: Any, name: str) -> dict[str, Array]:
    if aux is None:
        aux = {}
    if not isinstance(aux, Mapping):
        raise ValueError(
            f"{name} must return (loss, aux) with aux a dict of scalar metrics or None; "
            f"got aux of type {type(aux).__name__}."
        )
    out = {"loss": loss}
    for k, v in aux.items():
        if k in RESERVED_METRICS:
            raise ValueError(
                f"{name}: aux metric name {k!r} is reserved: the names {RESERVED_METRICS} "
                "are written by the train step and loop; rename the metric."
            )
        numeric = eqx.is_array_like(v) and (
            jnp.issubdtype(jnp.result_type(v), jnp.number) or jnp.result_type(v) == jnp.bool_
        )
        if not numeric:
            raise ValueError(
                f"{name}: aux metric {k!r} is {short_repr(v)}; metrics must be scalar numbers "
                "(a JAX or NumPy scalar, a float, an int or a bool)."
            )
        if jnp.ndim(v) != 0:
            raise ValueError(
                f"{name}: aux metric {k!r} has shape {jnp.shape(v)}; metrics must be scalars."
            )
        out[str(k)] = v
    return out


def _call_loss(loss_fn: LossFn, name: str, model, batch, key) -> tuple[Array, Any]:
    out = loss_fn(model, batch, key)
    if not (isinstance(out, tuple) and len(out) == 2):
        if isinstance(out, tuple):
            got = f"a tuple of {len(out)}"
        elif isinstance(out, jax.Array | np.ndarray | float | int):
            got = f"an array of shape {jnp.shape(out)} (return (loss, None) for no metrics)"
        else:
            got = type(out).__name__
        raise ValueError(
            f"{name} must return a pair (loss, aux) (aux a dict of metrics, or None), got {got}."
        )
    if jnp.ndim(out[0]) != 0:  # checked here, before the gradient's own error
        raise ValueError(f"{name}: the loss has shape {jnp.shape(out[0])}; it must be a scalar.")
    if name == "loss_fn" and not jnp.issubdtype(jnp.result_type(out[0]), jnp.floating):
        raise ValueError(
            f"{name}: the loss has dtype {jnp.result_type(out[0])}; it must be a real "
            "floating scalar (a gradient needs one)."
        )
    return out


def _check_callable(name: str, fn: object, *, optional: bool = False) -> None:
    """A `TypeError` naming `fn` unless it is callable (or `None`, if `optional`): it
    would fail only when first called, inside the jitted step."""
    if not (callable(fn) or (optional and fn is None)):
        expected = "a function" + (" or None" if optional else "")
        raise TypeError(f"{name} must be {expected}, got {name}={short_repr(fn)}")


def _check_optimizer(optimizer: object) -> None:
    if not (
        callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))
    ):
        raise TypeError(
            "optimizer must be an optax.GradientTransformation (with init and update), "
            f"got optimizer={optimizer!r}"
        )


class _StepInputs(NamedTuple):
    """The train step's inputs other than the model and optimiser state: its first
    argument, which `donate="all-except-first"` leaves alone."""

    loss_fn: LossFn
    optimizer: optax.GradientTransformation
    mesh: jax.sharding.Mesh | None
    min_shard_size: int
    batch: Any
    key: PRNGKeyArray
    index: Any  # `None`, or the step whose key is `jr.fold_in(key, index)`


def _train_step_impl(inputs: _StepInputs, model, opt_state):
    # One module-level jitted function: `loss_fn` and `optimizer` are (static) arguments,
    # so calling `train` again with the same ones (e.g. to resume) compiles nothing.
    loss_fn, optimizer, mesh, min_shard_size, batch, key, index = inputs
    if index is not None:  # the train loop's per-step key, folded in here (no dispatch)
        key = jr.fold_in(key, index)
    loss = lambda m: _call_loss(loss_fn, "loss_fn", m, batch, key)
    (loss, aux), grads = eqx.filter_value_and_grad(loss, has_aux=True)(model)
    metrics = _metrics(loss, aux, "loss_fn")
    metrics["grad_norm"] = optax.tree.norm(grads)
    params = eqx.filter(model, eqx.is_inexact_array)
    # The loss, for optimisers that take it (optax.contrib.reduce_on_plateau).
    extra = {"value": loss} if isinstance(optimizer, optax.GradientTransformationExtraArgs) else {}
    _check_opt_state(opt_state, optimizer, params)
    updates, opt_state = optimizer.update(grads, opt_state, params, **extra)
    model = eqx.apply_updates(model, updates)
    if mesh is not None:
        model = shard_params(model, mesh, min_shard_size=min_shard_size)
        opt_state = shard_params(opt_state, mesh, min_shard_size=min_shard_size)
    return model, opt_state, metrics


def _check_opt_state(opt_state: PyTree, optimizer: optax.GradientTransformation, params) -> None:
    """A `ValueError` naming `opt_state` and its first leaf at fault unless it has the
    leaves (paths and shapes) of `optimizer.init(params)`: optax's own error names
    neither. Run when the step is traced, so it costs the step nothing."""
    want = jtu.tree_flatten_with_path(eqx.filter_eval_shape(optimizer.init, params))[0]
    got = jtu.tree_flatten_with_path(opt_state)[0]
    problem = None
    for (pw, w), (pg, g) in zip(want, got, strict=False):  # the first leaf at fault
        if pg != pw:
            problem = f"it has opt_state{jtu.keystr(pg)} where opt_state{jtu.keystr(pw)} belongs"
        elif np.shape(g) != np.shape(w):
            problem = f"opt_state{jtu.keystr(pg)} has shape {np.shape(g)}, not {np.shape(w)}"
        if problem is not None:
            break
    if problem is None and len(got) < len(want):
        problem = f"it lacks the leaf opt_state{jtu.keystr(want[len(got)][0])}"
    elif problem is None and len(got) > len(want):
        problem = f"it has an extra leaf opt_state{jtu.keystr(got[len(want)][0])}"
    if problem is not None:
        raise ValueError(
            "opt_state does not fit the optimizer and model: it must be (a state like) "
            f"optimizer.init(eqx.filter(model, eqx.is_inexact_array)), but {problem}"
        )


def _is_deleted(x: object) -> bool:
    return isinstance(x, jax.Array) and x.is_deleted()


def _jit_without_waiting(fun: Callable, *, donate: bool) -> Callable:
    """`eqx.filter_jit(fun, donate="all-except-first" if donate else "none")` for
    `fun(inputs, model, opt_state)`, without its wait for the result: a filter-jitted
    call blocks until the device has finished (to report Equinox's run-time errors), so
    a train loop could not load its next batch while a step runs. Errors of run-time
    checks surface where the results are read (the loop's metric flushes)."""

    @ft.partial(jax.jit, static_argnums=0, donate_argnums=2 if donate else ())
    def train_step(static, kept, donated):
        inputs_static, state_static = static
        inputs = eqxi.hashable_combine(kept, inputs_static)
        model, opt_state = eqxi.hashable_combine(donated, state_static)
        dynamic, out_static = eqx.partition(fun(inputs, model, opt_state), eqx.is_array)
        return dynamic, eqxi.Static(out_static)

    def call(inputs, model, opt_state):
        kept, inputs_static = eqxi.hashable_partition(inputs, eqx.is_array)
        donated, state_static = eqxi.hashable_partition((model, opt_state), eqx.is_array)
        try:
            with warnings.catch_warnings():  # (as eqx.filter_jit: e.g. donated int scalars)
                warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
                dynamic, out_static = train_step((inputs_static, state_static), kept, donated)
        except (ValueError, RuntimeError) as e:  # "Buffer/Array has been deleted", named
            if not (donate and any(_is_deleted(x) for x in jax.tree.leaves(donated))):
                raise
            raise ValueError(
                "model or opt_state holds arrays already donated to a train step (its "
                "buffers are reused for the step's outputs): pass the model and opt_state "
                "the last step returned, copy what you keep, or build the step with "
                "donate=False."
            ) from e
        return eqx.combine(dynamic, out_static.value)

    return call


_train_step = _jit_without_waiting(_train_step_impl, donate=True)
_train_step_no_donation = _jit_without_waiting(_train_step_impl, donate=False)


@eqx.filter_jit
def _eval_step(loss_fn, model, batch, key):
    model = eqx.nn.inference_mode(model)
    loss, aux = _call_loss(loss_fn, "eval_fn", model, batch, key)
    return _metrics(loss, aux, "eval_fn")


@eqx.filter_jit
def _init(optimizer, params, mesh, min_shard_size):
    opt_state = optimizer.init(params)
    if mesh is not None:  # laid out by the program: never whole on one device
        opt_state = shard_params(opt_state, mesh, min_shard_size=min_shard_size)
    return opt_state


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    mesh: jax.sharding.Mesh | None = None,
    min_shard_size: int = 2**16,
    donate: bool = True,
) -> Callable[[PyTree, PyTree, Any, PRNGKeyArray], tuple[PyTree, PyTree, dict[str, Array]]]:
    """Build the jitted train step `step(model, opt_state, batch, key)`.

    Gradients are taken with respect to the inexact arrays of the model only
    (`eqx.filter_value_and_grad`); the optimiser is updated on
    `eqx.filter(model, eqx.is_inexact_array)`.

    **Arguments:**

    - `loss_fn`: `loss_fn(model, batch, key) -> (loss, aux)` with a scalar `loss` and
        `aux` a dict of scalar metrics (or `None`), not named as the records' own
        fields (`"loss"`, `"grad_norm"`, `"lr"`, `"step"`, `"split"`, `"samples_per_s"`,
        `"tokens_per_s"`). It receives the whole batch and does its own `jax.vmap` over
        examples.
    - `optimizer`: an optax optimiser, e.g. from [`lineax_seq.make_optimizer`][]. One
        that takes extra arguments (an `optax.GradientTransformationExtraArgs`, such as
        a chain with `optax.contrib.reduce_on_plateau`) gets `value=loss`.
    - `mesh`: if given, the new model and optimiser state are constrained to
        [`lineax_seq.param_sharding`][] on this mesh (tensor-parallel weights stay put).
        The batch is taken as placed: split it over `"data"` with
        [`lineax_seq.shard_batch`][] first (as [`lineax_seq.train`][] does), or every
        device computes the whole batch. Without `mesh`, whatever shardings the inputs
        carry are propagated by the compiler.
    - `min_shard_size`: arrays with fewer elements are replicated rather than split
        over the mesh's `"model"` axis (see [`lineax_seq.param_sharding`][]).
    - `donate`: donate the model's and optimiser state's buffers to the step (the
        arrays passed in are invalid afterwards; memory is reused in place).

    **Returns:**

    `step(model, opt_state, batch, key) -> (model, opt_state, metrics)`, where
    `metrics` holds `"loss"`, `"grad_norm"` (before clipping) and the aux metrics,
    all as scalar arrays. The batch's Python and NumPy numbers are taken as arrays
    (traced: a new value compiles nothing); a string or object leaf is a `TypeError`
    naming it. Where dispatch is asynchronous (GPU, TPU) the step returns
    before the device has run it (an `eqx.filter_jit` call would wait), so the next
    batch loads meanwhile; reading `metrics` waits, and raises any run-time check's
    error.
    """

    _check_callable("loss_fn", loss_fn)
    _check_optimizer(optimizer)
    if mesh is not None:
        _check_train_mesh(mesh)
    donate = check_bool("donate", donate)
    min_shard_size = check_int("min_shard_size", min_shard_size, minimum=0)
    indexed_step = _indexed_train_step(loss_fn, optimizer, mesh, min_shard_size, donate)

    def step(model, opt_state, batch, key):
        return indexed_step(model, opt_state, batch, key, None)

    return step


def _check_train_mesh(mesh: jax.sharding.Mesh) -> None:
    """`check_mesh`, and a `ValueError` unless the mesh has the axes the train step
    shards over: `"data"` (the batch) and `"model"` (the parameters)."""
    check_mesh(mesh)
    if not {"data", "model"} <= set(mesh.axis_names):
        raise ValueError(
            f"mesh must have the axes ('data', 'model'), got {tuple(mesh.axis_names)}; "
            "build it with lineax_seq.make_mesh (model=1 replicates the weights)."
        )


def _indexed_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    mesh: jax.sharding.Mesh | None,
    min_shard_size: int,
    donate: bool,
) -> Callable:
    """`make_train_step`'s step with one more argument, `index`: the key it passes to
    `loss_fn` is then `jr.fold_in(key, index)`, computed inside the jitted step."""
    jitted = _train_step if donate else _train_step_no_donation

    def step(model, opt_state, batch, key, index):
        batch = batch_arrays(batch)
        inputs = _StepInputs(loss_fn, optimizer, mesh, min_shard_size, batch, key, index)
        return jitted(inputs, model, opt_state)

    return step


def make_eval_step(
    loss_fn: LossFn,
) -> Callable[[PyTree, Any, PRNGKeyArray], dict[str, Array]]:
    """Build the jitted evaluation step `eval_step(model, batch, key) -> metrics`.

    `loss_fn` is called on `eqx.nn.inference_mode(model)`: dropout is off (in every
    module whose `inference` argument is left `None`), even where `loss_fn` passes the
    key on, so dropout does not draw from `key`.

    **Arguments:**

    - `loss_fn`: `loss_fn(model, batch, key) -> (loss, aux)`, as for
        [`lineax_seq.make_train_step`][] (the train loss itself will do).

    **Returns:**

    `eval_step(model, batch, key) -> metrics`, a dict of scalar arrays with `"loss"`.
    """
    _check_callable("loss_fn", loss_fn)

    def eval_step(model, batch, key):
        return _eval_step(loss_fn, model, batch_arrays(batch), key)

    return eval_step
