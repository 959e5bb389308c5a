"""Training objectives of the Koopman autoencoder (equations 1.3.4-1.3.6) and the MLP baseline."""

import numbers
from typing import cast

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._checks import (
    IntLike,
    RealLike,
    as_float_array,
    check_choice,
    check_finite,
    check_instance,
    check_optional_int,
    check_real_or_traced,
)
from .._numerics import work_dtype
from ._autoencoder import KoopmanAutoencoder, MLPBaseline
from ._unroll import METHODS, promote, unroll, unroll_latents

_Weight = RealLike | np.integer | np.floating | Float[Array, ""]


def _norms(a: Array) -> Array:
    # Euclidean norm of each row, with a safe gradient at zero; summed in at least float32
    # (in float16, 1e-12 is 0 and the gradient at zero NaN; large rows overflowed).
    wide = a.astype(work_dtype(a.dtype))
    return jnp.sqrt(jnp.sum(wide**2, axis=-1) + 1e-12).astype(a.dtype)


def _weight(name: str, value: object) -> RealLike | Array | np.ndarray:
    """A loss weight: a real number (a NumPy one as a Python `float`, weakly typed like
    one) or a scalar float array; not a bool (an array of weights would make the loss an
    array), finite and non-negative (a traced one checked at run time)."""
    real = isinstance(value, numbers.Real) or (
        isinstance(value, jax.Array | np.ndarray | np.generic)
        and jnp.issubdtype(value.dtype, jnp.floating)
        and value.shape == ()
    )
    if isinstance(value, bool | np.bool_) or not real:
        raise ValueError(
            f"{name} must be a real number or a scalar float array, got {name}={value!r}"
        )
    check_real_or_traced(name, value, "nonnegative")
    if isinstance(value, np.generic):
        return float(value)
    return cast(RealLike | Array | np.ndarray, value)


def _check_window(
    model: KoopmanAutoencoder | MLPBaseline, xs: Array | np.ndarray, actions
) -> tuple[Array, Array | None, int]:
    """`(xs, actions, steps)`: the window, checked to be finite, the actions (as JAX
    arrays) and the window's number of steps."""
    xs = as_float_array("xs", xs)
    actions = as_float_array("actions", actions, optional=True)
    if xs.ndim != 2 or xs.shape[1] != model.state_dim:
        raise ValueError(
            f"xs must have shape (window, state_dim={model.state_dim}), got xs.shape={xs.shape}"
        )
    if xs.shape[0] < 2:
        raise ValueError(f"xs has {xs.shape[0]} states; a window needs at least 2")
    xs, actions = promote(model, check_finite("xs", xs), actions)
    return xs, actions, xs.shape[0] - 1


def koopman_loss(
    model: KoopmanAutoencoder,
    xs: Float[Array | np.ndarray, "window state_dim"],
    actions: Float[Array | np.ndarray, "horizon action_dim"] | None = None,
    *,
    alignment: _Weight = 1.0,
    reconstruction: _Weight = 1.0,
    prediction: _Weight = 0.0,
    sparsity: _Weight = 1e-3,
    action: _Weight | None = None,
    reencode_every: IntLike | None = None,
    method: str = "parallel",
) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
    """The Koopman objective on one window `x_t, ..., x_{t+T}` (section 1.3.1).

    With `z_i = phi(x_{t+i})` and `zhat_i` the latents unrolled from `z_0` (optionally
    with periodic reencoding during training):

    - alignment `sum_{i=1..T} ||zhat_i - z_i||_2`,
    - reconstruction `sum_{i=0..T} ||x_{t+i} - psi(z_i)||_2`,
    - prediction `sum_{i=1..T} ||x_{t+i} - psi(zhat_i)||_2` (off by default: the paper
      finds it harmful on the low-dimensional systems),
    - sparsity `sum_{i=0..T} ||z_i||_1` (weight 1e-3),
    - action `sum_i ||u_{t+i} - head(z_i)||_2` when the model has an action head.

    Norms are Euclidean, not squared, as in the paper (`sqrt(|r|^2 + 1e-12)`: a safe
    gradient at zero, 1e-6 for a zero residual). Batch with `jax.vmap` and average.

    **Arguments:**

    - `model`: the autoencoder.
    - `xs`: states `(T + 1, state_dim)`, finite (a JAX or NumPy array).
    - `actions`: controls `(T, action_dim)`, or `None` for autonomous models. For an
        autonomous model with an action head (semi-open-loop control): the head's
        targets `(T, head_action_dim)`, or `None` (no action term).
    - `alignment`, `reconstruction`, `prediction`, `sparsity`, `action`: weights
        (Python or NumPy numbers, not bools, or scalar float arrays, e.g. traced under
        `jit`), finite and non-negative. `action` (default 1.0) needs a model with an
        action head.
    - `reencode_every`: reencoding period inside the training unroll, or `None`.
    - `method`: how the training unroll is computed (see [`unroll`][lineax_seq.unroll];
        for short windows on CPU `"sequential"` is often cheaper).

    **Returns:**

    `(loss, terms)`: the weighted scalar loss and a dict of the unweighted terms
    (every term, whatever its weight; `"action"` only with an action head and actions).
    """
    check_instance("model", model, KoopmanAutoencoder)
    # Checked here, not by `unroll_latents`'s type checker: its error names a function
    # the caller never called.
    reencode_every = check_optional_int("reencode_every", reencode_every)
    check_choice("method", method, METHODS)
    if action is None:
        action = 1.0
    elif model.action_head is None:
        raise ValueError(
            f"action={action!r} weighs the action head's loss, but the model has no action "
            "head (action_head=False): leave it None"
        )
    xs, actions, steps = _check_window(model, xs, actions)
    controls = actions if model.action_dim else None  # else the head's targets only
    if actions is not None and not model.action_dim:
        if model.action_head is None:
            controls = actions  # refused by the unroll: the model takes no actions
        elif actions.shape != (steps, model.head_action_dim):
            raise ValueError(
                f"actions has shape {actions.shape}, expected the action head's targets "
                f"(steps, head_action_dim) = {(steps, model.head_action_dim)}"
            )
        else:
            actions = check_finite("actions", actions)
    zs = jax.vmap(model.encode)(xs)
    zhat = unroll_latents(
        model, xs[0], controls, steps=steps, reencode_every=reencode_every, method=method
    )
    terms = {
        "alignment": jnp.sum(_norms(zhat - zs[1:])),
        "reconstruction": jnp.sum(_norms(xs - jax.vmap(model.decode)(zs))),
        "prediction": jnp.sum(_norms(xs[1:] - jax.vmap(model.decode)(zhat))),
        "sparsity": jnp.sum(jnp.abs(zs)),
    }
    if model.action_head is not None and actions is not None:
        terms["action"] = jnp.sum(_norms(actions - jax.vmap(model.predict_action)(zs[:-1])))
    weights = {
        "alignment": alignment,
        "reconstruction": reconstruction,
        "prediction": prediction,
        "sparsity": sparsity,
        "action": action,
    }
    # Every weight is checked, also one whose term is absent (an action head without actions).
    weights = {name: _weight(name, value) for name, value in weights.items()}
    loss = cast(Array, sum(weights[name] * value for name, value in terms.items()))
    return loss, terms


def mlp_baseline_loss(
    model: MLPBaseline,
    xs: Float[Array | np.ndarray, "window state_dim"],
    actions: Float[Array | np.ndarray, "horizon action_dim"] | None = None,
) -> tuple[Float[Array, ""], dict[str, Float[Array, ""]]]:
    """Multi-step prediction loss `sum_{i=1..T} ||x_{t+i} - xhat_{t+i}||_2` of the baseline.

    Returns `(loss, terms)` as [`koopman_loss`][lineax_seq.koopman_loss] does, so one
    training loop serves both. Batch with `jax.vmap` and average.

    **Arguments:**

    - `model`: the baseline.
    - `xs`: states `(T + 1, state_dim)`, finite (a JAX or NumPy array).
    - `actions`: controls `(T, action_dim)`, or `None`.

    **Returns:**

    `(loss, terms)`: the scalar loss and a dict of its one term, `{"prediction": loss}`
    (the key of the same term in `koopman_loss`).
    """
    check_instance("model", model, MLPBaseline)
    xs, actions, steps = _check_window(model, xs, actions)
    pred = unroll(model, xs[0], actions, steps=steps)
    loss = jnp.sum(_norms(xs[1:] - pred))
    return loss, {"prediction": loss}
