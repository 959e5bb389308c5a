"""Training objectives of the Koopman autoencoder (equations 1.3.4-1.3.6) and the MLP baseline."""

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float

from .._checks import check_finite
from ._autoencoder import KoopmanAutoencoder, MLPBaseline
from ._unroll import unroll, unroll_latents


def _norms(a: Array) -> Array:
    # Euclidean norm of each row, with a safe gradient at zero.
    return jnp.sqrt(jnp.sum(a**2, axis=-1) + 1e-12)


def _check_window(model: KoopmanAutoencoder | MLPBaseline, xs: Array) -> tuple[Array, int]:
    """`(xs, steps)`: the window, checked to be finite, and its number of steps."""
    if xs.ndim != 2 or xs.shape[1] != model.state_dim:
        raise ValueError(
            f"xs must have shape (window, state_dim={model.state_dim}), got xs.shape={xs.shape}"
        )
    if xs.shape[0] < 2:
        raise ValueError(f"xs has {xs.shape[0]} states; a window needs at least 2")
    return check_finite("xs", xs), xs.shape[0] - 1


def koopman_loss(
    model: KoopmanAutoencoder,
    xs: Float[Array, "window state_dim"],
    actions: Float[Array, "horizon action_dim"] | None = None,
    *,
    alignment: float | Float[Array, ""] = 1.0,
    reconstruction: float | Float[Array, ""] = 1.0,
    prediction: float | Float[Array, ""] = 0.0,
    sparsity: float | Float[Array, ""] = 1e-3,
    action: float | Float[Array, ""] = 1.0,
    reencode_every: int | None = None,
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

    Norms are Euclidean, not squared, as in the paper. Batch with `jax.vmap` and average.

    **Arguments:**

    - `model`: the autoencoder.
    - `xs`: states `(T + 1, state_dim)`, finite.
    - `actions`: controls `(T, action_dim)`, or `None` for autonomous models.
    - `alignment`, `reconstruction`, `prediction`, `sparsity`, `action`: weights
        (Python numbers or arrays, e.g. traced under `jit`).
    - `reencode_every`: reencoding period inside the training unroll, or `None`.
    - `method`: how the training unroll is computed (see [`unroll`][lineax_seq.unroll];
        for short windows on CPU `"sequential"` is often cheaper).

    **Returns:**

    `(loss, terms)`: the weighted scalar loss and a dict of the unweighted terms
    (every term, whatever its weight; `"action"` only with an action head and actions).
    """
    xs, steps = _check_window(model, xs)
    zs = jax.vmap(model.encode)(xs)
    zhat = unroll_latents(
        model, xs[0], actions, steps=steps, reencode_every=reencode_every, method=method
    )
    terms = {
        "alignment": jnp.sum(_norms(zhat - zs[1:])),
        "reconstruction": jnp.sum(_norms(xs - jax.vmap(model.decode)(zs))),
        "prediction": jnp.sum(_norms(xs[1:] - jax.vmap(model.decode)(zhat))),
        "sparsity": jnp.sum(jnp.abs(zs)),
    }
    weights = {
        "alignment": alignment,
        "reconstruction": reconstruction,
        "prediction": prediction,
        "sparsity": sparsity,
    }
    if model.action_head is not None and actions is not None:
        terms["action"] = jnp.sum(_norms(actions - jax.vmap(model.predict_action)(zs[:-1])))
        weights["action"] = action
    loss = sum(weights[name] * value for name, value in terms.items())
    return loss, terms


def mlp_baseline_loss(
    model: MLPBaseline,
    xs: Float[Array, "window state_dim"],
    actions: Float[Array, "horizon action_dim"] | None = None,
) -> Float[Array, ""]:
    """Multi-step prediction loss `sum_{i=1..T} ||x_{t+i} - xhat_{t+i}||_2` of the baseline.

    **Arguments:**

    - `model`: the baseline.
    - `xs`: states `(T + 1, state_dim)`, finite.
    - `actions`: controls `(T, action_dim)`, or `None`.

    **Returns:**

    The scalar loss.
    """
    xs, steps = _check_window(model, xs)
    pred = unroll(model, xs[0], actions, steps=steps)
    return jnp.sum(_norms(xs[1:] - pred))
