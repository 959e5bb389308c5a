"""Unrolling Koopman models in discrete time: parallel between reencodings."""

from typing import overload

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from beartype import beartype
from jaxtyping import Array, ArrayLike, Float, jaxtyped

from .._checks import (
    IntLike,
    check_choice,
    check_instance,
    check_int,
    check_optional_int,
)
from ..systems import _diffeq
from ._autoencoder import KoopmanAutoencoder, MLPBaseline, UnitNormLinear
from ._dynamics import _HIGHEST, LinearKoopmanDynamics, matmul

# Without reencoding the latent recurrence is still cut into chunks of at most this many
# steps, so the table of powers of Kbar stays small (the chunks are chained exactly).
_MAX_CHUNK = 128
METHODS = ("parallel", "sequential")


def _concrete(a: ArrayLike) -> np.ndarray | None:
    """The value of `a` on the host, or `None` when it is traced (a value inside `jit`
    that is closed over, not an argument, is concrete: pass it before any conversion)."""
    return None if isinstance(a, jax.core.Tracer) else np.asarray(a)


@overload
def promote(model: eqx.Module, first: Array, second: Array, /) -> tuple[Array, Array]: ...
@overload
def promote(
    model: eqx.Module, first: Array, second: Array | None, /
) -> tuple[Array, Array | None]: ...
@overload
def promote(
    model: eqx.Module, first: Array, second: Array, third: Array | None, /
) -> tuple[Array, Array, Array | None]: ...
def promote(model: eqx.Module, *arrays: Array | None) -> tuple[Array | None, ...]:
    """`arrays` (`None` passes through) cast to the dtype JAX's promotion gives them
    together with `model`'s floating parameters, as Equinox's layers would compute: under
    x64 a float32 model fed float64 states or times (NumPy's default) computes in float64, and
    every scan carry keeps one dtype. Under `jax_numpy_dtype_promotion="strict"` mixed
    precisions raise JAX's promotion error, naming both dtypes."""
    params = jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array))
    dtype = jnp.result_type(*params, *(a for a in arrays if a is not None))
    return tuple(None if a is None else a.astype(dtype) for a in arrays)


def _check_actions(
    model, actions: Array | None, steps: int, steps_name: str = "steps"
) -> Array | None:
    if model.action_dim == 0:
        if actions is not None:
            raise ValueError(
                f"actions has shape {actions.shape}, but the model has action_dim=0 "
                "(autonomous): pass actions=None"
            )
        return None
    if actions is None:
        raise ValueError(f"the model has action_dim={model.action_dim}: actions are required")
    return _diffeq.check_actions(actions, steps, model.action_dim, steps_name)


def _powers(Kbar: Array, length: int) -> Array:
    """`[Kbar^1, ..., Kbar^length]`, shape `(length, n, n)`, by a parallel prefix product."""
    mats = jnp.broadcast_to(Kbar, (length, *Kbar.shape))
    return jax.lax.associative_scan(matmul, mats)


def _forced(powers: Array, b: Array) -> Array:
    """`s_i = sum_{l <= i} Kbar^(i - l) b_l` for all `i`, by an associative scan.

    Elements are `(count, s)`; combining `(c1, s1)` then `(c2, s2)` gives
    `(c1 + c2, Kbar^c2 s1 + s2)`, with `Kbar^c2` looked up in the table of powers.
    """

    def combine(left, right):
        c1, s1 = left
        c2, s2 = right
        return c1 + c2, jnp.einsum("...ij,...j->...i", powers[c2 - 1], s1, precision=_HIGHEST) + s2

    counts = jnp.ones(b.shape[0], dtype=jnp.int32)
    _, s = jax.lax.associative_scan(combine, (counts, b))
    return s


def _blocks(steps: int, reencode_every: int | None) -> tuple[bool, int, int]:
    """`(reencode, block, num_blocks)`: the period `k`, or chunks of `_MAX_CHUNK` steps."""
    if reencode_every is not None and reencode_every < steps:
        return True, reencode_every, -(-steps // reencode_every)
    block = min(steps, _MAX_CHUNK)
    return False, block, -(-steps // block)


def _readout_rollout(
    model: KoopmanAutoencoder,
    dynamics: LinearKoopmanDynamics,
    decoder: UnitNormLinear,
    z0: Array,
    steps: int,
    reencode_every: int | None,
) -> Array:
    """Decoded states `x_1..x_steps` of a linear model with a linear decoder (`dynamics`
    and `decoder`, the model's), `(steps, d)`.

    `x_{bk + j} = W Kbar^j z_b + bias` with `z_b` the latent at the start of block `b`:
    the table `W Kbar^j` (`(k, d, n)`, built with `k` products of size `d x n x n`)
    turns every step into an `O(d n)` product instead of `O(n^2)`, and only block ends
    need the latent (`phi(x)` with reencoding, `Kbar^k z_b` by repeated squaring without).
    """
    reencode, block, num_blocks = _blocks(steps, reencode_every)
    Kbar, _ = dynamics.discretize()

    def grow(r, _):
        r = matmul(r, Kbar)
        return r, r

    # W Kbar^1 .. W Kbar^block: `block` small (d, n) @ (n, n) products.
    _, readout = jax.lax.scan(grow, decoder.normalized_weight(), None, length=block)
    readout = readout.reshape(-1, model.latent_dim)
    bias = decoder.bias
    if reencode:
        jump = None
    else:
        with jax.default_matmul_precision("highest"):
            jump = jnp.linalg.matrix_power(Kbar, block)

    def body(z, _):
        xs = matmul(readout, z).reshape(block, -1) + bias
        z_next = model.encode(xs[-1]) if jump is None else matmul(jump, z)
        return z_next, xs

    _, xs = jax.lax.scan(body, z0, None, length=num_blocks)
    return xs.reshape(num_blocks * block, -1)[:steps]


def _latent_rollout(
    model: KoopmanAutoencoder,
    z0: Array,
    vs: Array | None,
    steps: int,
    reencode_every: int | None,
    method: str,
) -> Array:
    """Predicted latents `zhat_1..zhat_steps` (before any reencoding), `(steps, n)`.

    Steps are grouped into blocks; with reencoding the block is the period `k` and each
    block ends with `z <- phi(psi(z))`. Inside a block the linear recurrence is evaluated
    in parallel from a table of powers of `Kbar`, by chunks of at most `_MAX_CHUNK`
    steps (so the table stays `(chunk, n, n)` for any period); the chunks and the blocks
    follow each other in scans.
    """
    reencode, block, num_blocks = _blocks(steps, reencode_every)
    parts = -(-block // _MAX_CHUNK)
    chunk = -(-block // parts)  # the last chunk of a block padded to it
    if vs is not None:
        vs = jnp.concatenate([vs, jnp.zeros((num_blocks * block - steps, vs.shape[1]), vs.dtype)])
        vs = vs.reshape(num_blocks, block, vs.shape[1])
        vs = jnp.pad(vs, ((0, 0), (0, parts * chunk - block), (0, 0)))
        vs = vs.reshape(num_blocks, parts, chunk, vs.shape[-1])

    dynamics = model.dynamics
    Kbar = Lbar = powers = None
    if isinstance(dynamics, LinearKoopmanDynamics):
        Kbar, Lbar = dynamics.discretize()
        if method == "parallel":
            powers = _powers(Kbar, chunk)

    def run_chunk(z, v_chunk):
        if powers is not None:
            # One (chunk * n, n) @ (n,) product; under vmap a single GEMM.
            zs = matmul(powers.reshape(-1, powers.shape[-1]), z).reshape(chunk, -1)
            if v_chunk is not None and Lbar is not None:
                # z_j = Kbar^j z_0 + sum_{i < j} Kbar^(j - 1 - i) Lbar v_i
                zs = zs + _forced(powers, matmul(v_chunk, Lbar.T))
            return zs[-1], zs

        def one(z, v):
            if Kbar is None:
                z = dynamics(z, v)
            elif v is None or Lbar is None:
                z = matmul(Kbar, z)
            else:
                z = matmul(Kbar, z) + matmul(Lbar, v)
            return z, z

        return jax.lax.scan(one, z, v_chunk, length=chunk)

    def body(z, v_block):
        if parts == 1:
            _, zs = run_chunk(z, None if v_block is None else v_block[0])
        else:
            _, zs = jax.lax.scan(run_chunk, z, v_block, length=parts)
            zs = zs.reshape(parts * chunk, -1)[:block]
        z_end = zs[-1]
        z_next = model.reencode(z_end) if reencode else z_end
        return z_next, zs

    _, zs = jax.lax.scan(body, z0, vs, length=num_blocks)
    return zs.reshape(num_blocks * block, -1)[:steps]


def _check_unroll(
    model, x0, actions, steps, reencode_every, method
) -> tuple[Array, Array | None, int, int | None]:
    """`(x0, actions, steps, reencode_every)`, checked, as JAX arrays and ints (traced
    arrays are checked for NaN at run time)."""
    reencode_every = check_optional_int("reencode_every", reencode_every)
    steps = check_int("steps", steps)
    check_choice("method", method, METHODS)
    actions = _check_actions(model, None if actions is None else jnp.asarray(actions), steps)
    x0, actions = promote(
        model, _diffeq.check_x0(jnp.asarray(x0), model.state_dim, "the model"), actions
    )
    return x0, actions, steps, reencode_every


# Jitted once per model structure, shapes, `steps`, `reencode_every` and `method` (not
# per call: the scans' bodies are fresh closures, which eager JAX would compile anew).
@eqx.filter_jit
def _latents(model: KoopmanAutoencoder, x0, actions, steps, reencode_every, method) -> Array:
    vs = None if actions is None else jax.vmap(model.encode_action)(actions)
    return _latent_rollout(model, model.encode(x0), vs, steps, reencode_every, method)


@jaxtyped(typechecker=beartype)
def unroll_latents(
    model: KoopmanAutoencoder,
    x0: Float[Array | np.ndarray, " state_dim"],
    actions: Float[Array | np.ndarray, "horizon action_dim"] | None = None,
    *,
    steps: IntLike,
    reencode_every: IntLike | None = None,
    method: str = "parallel",
) -> Float[Array, "horizon latent_dim"]:
    """The predicted latents `zhat_1 .. zhat_steps` of [`unroll`][lineax_seq.unroll],
    shape `(steps, latent_dim)`, from `x0` of shape `(state_dim,)` (and `actions` of
    shape `(steps, action_dim)` for a controlled model).

    Latents at reencoding steps are the ones *before* reencoding (those that are
    decoded). Used by the losses.

    **Arguments:** as for [`unroll`][lineax_seq.unroll], with `model` a
    [`KoopmanAutoencoder`][lineax_seq.KoopmanAutoencoder].

    **Returns:**

    The latents `zhat_1 .. zhat_steps`, shape `(steps, latent_dim)`.
    """
    check_instance("model", model, KoopmanAutoencoder)
    checked = _check_unroll(model, x0, actions, steps, reencode_every, method)
    return _latents(model, *checked, method)


@jaxtyped(typechecker=beartype)
def unroll(
    model: KoopmanAutoencoder | MLPBaseline,
    x0: Float[Array | np.ndarray, " state_dim"],
    actions: Float[Array | np.ndarray, "horizon action_dim"] | None = None,
    *,
    steps: IntLike,
    reencode_every: IntLike | None = None,
    method: str = "parallel",
) -> Float[Array, "horizon state_dim"]:
    """Predict `steps` future states from `x0` in discrete time (section 1.3.2).

    Encode `z_0 = phi(x_0)`, advance the latent with the model's dynamics and decode
    every step. With `reencode_every=k`, every `k` steps the latent is decoded and
    re-encoded, `z <- phi(psi(z))` (periodic reencoding; `k = 1` reencodes every step;
    `None`, or `k >= steps`, never reencodes). For linear dynamics the `k` steps between
    reencodings are computed in parallel (`method="parallel"`: a table of powers of
    `Kbar`, up to 128 steps at a time, and an associative scan for the control inputs;
    with the linear decoder and no controls the decoder is folded into the table,
    `x_{j} = (W Kbar^j) z_0 + b`, so a step costs `O(state_dim * latent_dim)`);
    `method="sequential"` is the plain step-by-step `lax.scan` (same result, for
    reference and benchmarks). The latent products run at `Precision.HIGHEST` (see
    [`LinearKoopmanDynamics`][lineax_seq.LinearKoopmanDynamics]); the encoder's and
    MLP decoder's follow JAX's default (`jax.default_matmul_precision`).

    An [`MLPBaseline`][lineax_seq.MLPBaseline] is unrolled autoregressively
    (`reencode_every` must then be `None`). Batch over initial conditions with
    `jax.vmap`.

    **Arguments:**

    - `model`: a [`KoopmanAutoencoder`][lineax_seq.KoopmanAutoencoder] or an
        [`MLPBaseline`][lineax_seq.MLPBaseline].
    - `x0`: initial state `(state_dim,)` (a JAX or NumPy array); must be finite.
    - `actions`: controls `(steps, action_dim)` applied at steps `0 .. steps-1`, or
        `None` for autonomous models.
    - `steps`: number of steps to predict, a positive (Python or NumPy) integer.
    - `reencode_every`: reencoding period, a positive integer, or `None`.
    - `method`: `"parallel"` or `"sequential"`. Without controls the parallel path is
        much faster (24x on 2 CPU cores at latent 128 in `benchmarks/koopman.py`); with
        controls its associative scan does more work than the plain scan, and on those
        cores `"sequential"` was 1.5-2.3x faster in one uncommitted timing (latent 128,
        batch 64): time both at your sizes.

    **Returns:**

    The predicted states `x_1 .. x_steps`, shape `(steps, state_dim)`.
    """
    check_instance("model", model, KoopmanAutoencoder, MLPBaseline)
    x0, actions, steps, reencode_every = _check_unroll(
        model, x0, actions, steps, reencode_every, method
    )
    if isinstance(model, MLPBaseline) and reencode_every is not None:
        raise ValueError(
            f"reencode_every={reencode_every} is meaningless for an MLPBaseline "
            "(it has no latent space): pass None"
        )
    return _unroll(model, x0, actions, steps, reencode_every, method)


@eqx.filter_jit  # as `_latents`
def _unroll(model, x0, actions, steps, reencode_every, method) -> Array:
    if isinstance(model, MLPBaseline):

        def one(x, u):
            x = model(x, u)
            return x, x

        _, xs = jax.lax.scan(one, x0, actions, length=steps)
        return xs
    dynamics, decoder = model.dynamics, model.decoder
    if (
        method == "parallel"
        and actions is None
        and isinstance(dynamics, LinearKoopmanDynamics)
        and isinstance(decoder, UnitNormLinear)
    ):
        # Decoding fused into the powers of Kbar: O(d n) per step.
        return _readout_rollout(model, dynamics, decoder, model.encode(x0), steps, reencode_every)
    zs = _latents(model, x0, actions, steps, reencode_every, method)
    return jax.vmap(model.decode)(zs)
