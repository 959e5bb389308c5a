"""Latent dynamics: linear Koopman generators (bilinear / exact) and a nonlinear MLP."""

import abc
import math

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
import jax.scipy.linalg as jsl
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._checks import (
    IntLike,
    RealScalar,
    check_choice,
    check_int,
    check_key,
    check_real,
    check_real_or_traced,
    check_state_control,
)
from .._numerics import work_dtype

_DISCRETIZATIONS = ("bilinear", "exact")

# The latent recurrence compounds every product's rounding over hundreds of steps:
# float32 throughout, not the TF32 that XLA:GPU uses for float32 matmuls by default.
# (`jax.scipy.linalg.expm` multiplies at HIGHEST already.)
_HIGHEST = jax.lax.Precision.HIGHEST


def matmul(a: Array, b: Array) -> Array:
    """`a @ b` at `HIGHEST` precision."""
    return jnp.matmul(a, b, precision=_HIGHEST)


def _check_sizes(
    latent_dim: object, action_latent_dim: object, dt: object
) -> tuple[int, int, float]:
    """`(latent_dim, action_latent_dim, dt)` as ints and a float, checked."""
    return (
        check_int("latent_dim", latent_dim),
        check_int("action_latent_dim", action_latent_dim, minimum=0),
        check_real("dt", dt),
    )


def _relu(x: Array) -> Array:
    return jax.nn.relu(x)


def _identity(x: Array) -> Array:
    return x


def relu_mlp(in_size: int, out_size: int, width: int, layers: int, *, key) -> eqx.nn.MLP:
    """`layers` linear layers with ReLU between them (Equinox counts hidden layers as
    depth). The activations are functions of this module, so the MLP pickles (neither
    `jax.nn.relu`, a `custom_jvp` object, nor `eqx.nn.MLP`'s default lambda does)."""
    return eqx.nn.MLP(
        in_size,
        out_size,
        width,
        depth=layers - 1,
        activation=_relu,
        final_activation=_identity,
        key=key,
    )


class AbstractLatentDynamics(eqx.Module):
    """Latent dynamics with a trainable step `delta = exp(log_delta)`.

    Subclasses give the rate `f(z, v)`, so that `dz/dt = (delta / dt) f(z, v)` in the
    data's time units, and the discrete step `z_{t+1} = step(z_t, v_t)` over one sampling
    interval.
    """

    log_delta: eqx.AbstractVar[Float[Array, ""]]
    latent_dim: eqx.AbstractVar[int]
    action_latent_dim: eqx.AbstractVar[int]
    dt: eqx.AbstractVar[float]

    @property
    def delta(self) -> Float[Array, ""]:
        """The trainable step `exp(log_delta)`, a scalar (initialised at the data's `dt`)."""
        return jnp.exp(self.log_delta)

    @abc.abstractmethod
    def rate(
        self,
        z: Float[Array | np.ndarray, " latent"],
        v: Float[Array | np.ndarray, " action_latent"] | None = None,
    ) -> Float[Array, " latent"]:
        """`f(z, v)` `(latent,)`, the time derivative per unit of `delta`, from the latent
        `z` `(latent,)` and the encoded control `v` `(action_latent,)` (or `None`)."""

    @abc.abstractmethod
    def step(
        self,
        z: Float[Array | np.ndarray, " latent"],
        v: Float[Array | np.ndarray, " action_latent"] | None = None,
    ) -> Float[Array, " latent"]:
        """One discrete step `z_{t+1}` `(latent,)` from `z` = `z_t` `(latent,)` and the
        encoded control `v` = `v_t` `(action_latent,)` (or `None`)."""

    def _check(self, z: object, v: object) -> tuple[Array, Array | None]:
        """`z` and `v` as JAX arrays of a real floating dtype: `z` of shape
        `(latent_dim,)`, `v` of shape `(action_latent_dim,)`, or `None` exactly when the
        dynamics are autonomous."""
        return check_state_control(
            ("z", z, self.latent_dim), ("v", v, self.action_latent_dim), "latent dynamics"
        )

    def vector_field(
        self,
        z: Float[Array | np.ndarray, " latent"],
        v: Float[Array | np.ndarray, " action_latent"] | None = None,
    ) -> Float[Array, " latent"]:
        """`dz/dt = (delta / dt) f(z, v)` in the data's time units.

        Same arguments as `__call__`: `v` is required exactly when the dynamics are
        controlled. A diffrax term calls `(t, y, args)`: wrap it, e.g.
        `diffrax.ODETerm(lambda t, z, dynamics: dynamics.vector_field(z))` with
        `args=dynamics` (as [`lineax_seq.unroll_continuous`][] does).
        """
        z, v = self._check(z, v)
        return (self.delta / self.dt) * self.rate(z, v)

    def __call__(
        self,
        z: Float[Array | np.ndarray, " latent"],
        v: Float[Array | np.ndarray, " action_latent"] | None = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, " latent"]:
        """One discrete step.

        **Arguments:**

        - `z`: latent state `(latent_dim,)`.
        - `v`: encoded control `(action_latent_dim,)`, or `None`.
        - `key`: ignored (the dynamics are deterministic); accepted, as by every Equinox
            layer, so that `eqx.nn.Sequential` can call them.

        **Returns:**

        The next latent state `(latent_dim,)`.
        """
        z, v = self._check(z, v)
        return self.step(z, v)


class LinearKoopmanDynamics(AbstractLatentDynamics):
    """Continuous-time linear latent dynamics `dz/dt = K z + L v` (section 1.3.1).

    Discretised over a trainable step `delta` (stored as `log_delta`, initialised
    from the data's sampling interval `dt`) by the bilinear (Tustin) transform

    `Kbar = (I - delta/2 K)^-1 (I + delta/2 K)`, `Lbar = (I - delta/2 K)^-1 delta L`

    (computed with one LU solve, never an explicit inverse; near an eigenvalue of `K`
    at `2 / delta`, where `I - delta/2 K` is singular, the entries blow up: huge, or
    non-finite when the solve meets an exact zero pivot), or
    exactly with the matrix exponential, `Kbar = exp(delta K)`,
    `Lbar = int_0^delta exp(s K) ds L` (zero-order hold).

    One discrete step covers `dt` of the data's time, so in physical time the
    generator is `(delta / dt) K` ([`generator`][lineax_seq.LinearKoopmanDynamics.generator]);
    with `delta == dt` (at initialisation) the two coincide.

    Its products (the step, the rate, the exponential) and those of the linear unrolls
    run at `jax.lax.Precision.HIGHEST`: hundreds of steps compound every rounding, and
    XLA:GPU's default for float32 products is TF32 (on an H200, 2.8e-3 between parallel
    and step-by-step unrolls over 1,000 steps, and a Diffrax solve 20x slower).
    """

    K: Float[Array, "latent latent"]
    L: Float[Array, "latent action_latent"] | None
    log_delta: Float[Array, ""]
    latent_dim: int = eqx.field(static=True)
    action_latent_dim: int = eqx.field(static=True)
    dt: float = eqx.field(static=True)
    discretization: str = eqx.field(static=True)

    def __init__(
        self,
        latent_dim: IntLike,
        action_latent_dim: IntLike = 0,
        *,
        dt: RealScalar = 0.01,
        discretization: str = "bilinear",
        init_scale: RealScalar = 1.0,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `latent_dim`: size `n` of the latent state.
        - `action_latent_dim`: size `m` of the encoded control input (0: autonomous).
        - `dt`: the data's sampling interval; initialises `delta`.
        - `discretization`: `"bilinear"` (the paper's) or `"exact"` (matrix exponential,
            actions held over the step: the zero-order hold, `S4DKernel`'s `"zoh"`).
        - `init_scale`: `K` is initialised `N(0, init_scale^2 / n)`, `L` `N(0, 1 / m)`;
            finite, `>= 0`.
        - `key`: PRNG key.
        """
        check_key("key", key)
        latent_dim, action_latent_dim, dt = _check_sizes(latent_dim, action_latent_dim, dt)
        # (Traced: e.g. an ensemble under vmap.)
        init_scale = check_real_or_traced("init_scale", init_scale, "nonnegative")
        check_choice("discretization", discretization, _DISCRETIZATIONS)
        k_key, l_key = jr.split(key)
        self.K = init_scale * jr.normal(k_key, (latent_dim, latent_dim)) / math.sqrt(latent_dim)
        self.L = (
            jr.normal(l_key, (latent_dim, action_latent_dim)) / math.sqrt(action_latent_dim)
            if action_latent_dim > 0
            else None
        )
        # JAX's default float dtype, like K, and not weakly typed (so that an optimiser
        # step returns the same type and a jitted train step compiles once).
        self.log_delta = jnp.asarray(math.log(dt), dtype=float)
        self.latent_dim = latent_dim
        self.action_latent_dim = action_latent_dim
        self.dt = dt
        self.discretization = discretization

    def generator(self) -> Float[Array, "latent latent"]:
        """The generator `(latent, latent)` in the data's time units, `(delta / dt) K`."""
        return (self.delta / self.dt) * self.K

    def discretize(
        self,
    ) -> tuple[Float[Array, "latent latent"], Float[Array, "latent action_latent"] | None]:
        """`(Kbar, Lbar)` of one step: `(latent, latent)`, `(latent, action_latent)` or
        `None`, in `K`'s dtype (computed in float32 at least: half precision has no
        linear solve or matrix exponential)."""
        dtype = self.K.dtype
        work = work_dtype(dtype)
        K, delta = self.K.astype(work), self.delta.astype(work)
        L = None if self.L is None else self.L.astype(work)
        n = self.latent_dim
        if self.discretization == "exact":
            if L is None:
                return jsl.expm(delta * K).astype(dtype), None
            m = self.action_latent_dim
            # exp([[K, L], [0, 0]] delta) = [[exp(K delta), int_0^delta exp(K s) ds L], [0, I]].
            block = jnp.zeros((n + m, n + m), work).at[:n, :n].set(K).at[:n, n:].set(L)
            big = jsl.expm(delta * block).astype(dtype)
            return big[:n, :n], big[:n, n:]
        eye = jnp.eye(n, dtype=work)
        rhs = eye + 0.5 * delta * K
        if L is not None:
            rhs = jnp.concatenate([rhs, delta * L], axis=1)
        # One LU factorisation for all columns. Not `lineax.linear_solve`: its failure
        # check (`eqx.error_if`, a host callback, also in the tangent and transposed
        # solves) is pinned to one device, so on a mesh XLA broadcast its results from
        # there ("involuntary full rematerialization") in every step.
        out = jnp.linalg.solve(eye - 0.5 * delta * K, rhs).astype(dtype)
        return (out[:, :n], out[:, n:]) if L is not None else (out, None)

    def rate(
        self,
        z: Float[Array | np.ndarray, " latent"],
        v: Float[Array | np.ndarray, " action_latent"] | None = None,
    ) -> Float[Array, " latent"]:
        """`K z + L v` `(latent,)`, so `dz/dt = (delta / dt) (K z + L v)`; `z` `(latent,)`,
        `v` `(action_latent,)` or `None`."""
        z, v = self._check(z, v)
        out = matmul(self.K, z)
        if v is not None and self.L is not None:
            out = out + matmul(self.L, v)
        return out

    def step(
        self,
        z: Float[Array | np.ndarray, " latent"],
        v: Float[Array | np.ndarray, " action_latent"] | None = None,
    ) -> Float[Array, " latent"]:
        """One discrete step `Kbar z + Lbar v` `(latent,)`; `z` `(latent,)`, `v`
        `(action_latent,)` or `None`."""
        z, v = self._check(z, v)
        Kbar, Lbar = self.discretize()
        out = matmul(Kbar, z)
        if v is not None and Lbar is not None:
            out = out + matmul(Lbar, v)
        return out


class MLPDynamics(AbstractLatentDynamics):
    """Nonlinear latent dynamics: a 3-layer ReLU MLP of `(z, v)` (appendix, Table 1.4).

    The MLP outputs a time derivative; one discrete step is
    `z + delta * mlp([z, v])` (a residual map `(z_t, v_t) -> z_{t+1}`), and in
    continuous time `dz/dt = (delta / dt) mlp([z, v])`, so the discrete step is the
    explicit Euler step of the continuous dynamics over `dt`.
    """

    mlp: eqx.nn.MLP
    log_delta: Float[Array, ""]
    latent_dim: int = eqx.field(static=True)
    action_latent_dim: int = eqx.field(static=True)
    dt: float = eqx.field(static=True)

    def __init__(
        self,
        latent_dim: IntLike,
        action_latent_dim: IntLike = 0,
        *,
        width: IntLike = 256,
        dt: RealScalar = 0.01,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `latent_dim`: size `n` of the latent state.
        - `action_latent_dim`: size `m` of the encoded control input (0: autonomous).
        - `width`: hidden width of the 3-layer MLP.
        - `dt`: the data's sampling interval; initialises `delta`.
        - `key`: PRNG key.
        """
        check_key("key", key)
        latent_dim, action_latent_dim, dt = _check_sizes(latent_dim, action_latent_dim, dt)
        width = check_int("width", width)
        self.mlp = relu_mlp(latent_dim + action_latent_dim, latent_dim, width, 3, key=key)
        # JAX's default float dtype, like K, and not weakly typed (so that an optimiser
        # step returns the same type and a jitted train step compiles once).
        self.log_delta = jnp.asarray(math.log(dt), dtype=float)
        self.latent_dim = latent_dim
        self.action_latent_dim = action_latent_dim
        self.dt = dt

    def rate(
        self,
        z: Float[Array | np.ndarray, " latent"],
        v: Float[Array | np.ndarray, " action_latent"] | None = None,
    ) -> Float[Array, " latent"]:
        """`mlp([z, v])` `(latent,)`, so `dz/dt = (delta / dt) mlp([z, v])`; `z` `(latent,)`,
        `v` `(action_latent,)` or `None`."""
        z, v = self._check(z, v)
        inp = z if v is None or self.action_latent_dim == 0 else jnp.concatenate([z, v])
        return self.mlp(inp)

    def step(
        self,
        z: Float[Array | np.ndarray, " latent"],
        v: Float[Array | np.ndarray, " action_latent"] | None = None,
    ) -> Float[Array, " latent"]:
        """One discrete step `z + delta * mlp([z, v])` `(latent,)` (explicit Euler over
        `dt`); `z` `(latent,)`, `v` `(action_latent,)` or `None`."""
        z, v = self._check(z, v)
        return z + self.delta * self.rate(z, v)
