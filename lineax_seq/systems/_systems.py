"""Vector fields and initial-condition samplers of the chapter-1 dynamical systems."""

import abc
import dataclasses
import math
from typing import ClassVar

import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray, Real

from .._checks import (
    IntLike,
    RealScalar,
    as_array,
    as_float_array,
    check_choice,
    check_int,
    check_key,
    check_real,
    check_real_traced,
    check_state_control,
)


class DynamicalSystem(eqx.Module):
    """An ODE `dx/dt = f(t, x, u)` with a sampler of initial conditions.

    Subclasses define `state_dim`, `action_dim` (0 for autonomous systems), the default
    sampling interval `dt`, `vector_field` and `sample_initial` (and, for a controlled
    system, `sample_actions(key, num, steps)`, the `(num, steps, action_dim)` controls
    that [`lineax_seq.sample_trajectories`][] draws). `args` of the vector
    field is the control input `u` (`Float[Array, "action_dim"]`) or `None` (always
    `None` for an autonomous system). The systems here check `x` and `args` with
    `self._check(x, args)`; a subclass's `vector_field` can call it too.

    The parameters named in the class variable `constraints` (`{name: sign}`, `sign`
    one of `"positive"`, `"nonnegative"`, `"finite"`; by default `{"dt": "positive"}`)
    are checked at construction to be real and finite, of that sign: a value traced
    inside a JAX transform (a system built under `jit` or `vmap`) at run time, so an
    optimiser fitting a parameter must keep it in range (e.g. fit `log g`).

    Parameters given as Python numbers (the defaults) are static, as in Equinox:
    `eqx.filter_jit` compiles once per value and `eqx.filter_grad` does not
    differentiate them. For parameter sweeps or system identification pass JAX arrays,
    e.g. `Pendulum(g=jnp.asarray(9.81))`: traced, differentiable, one compilation.
    """

    state_dim: ClassVar[int]
    action_dim: ClassVar[int] = 0
    constraints: ClassVar[dict[str, str]] = {"dt": "positive"}
    dt: eqx.AbstractVar[RealScalar]

    def __check_init__(self):
        traced = []  # jit arguments, or under vmap: checked at run time, together
        for name, sign in self.constraints.items():
            value = getattr(self, name)
            if isinstance(value, jax.core.Tracer):
                traced.append((f"{type(self).__name__}.{name}", value, sign))
                continue
            # An array of parameters (a batch of systems, for vmap): every entry.
            for v in np.ravel(np.asarray(value)) if np.ndim(value) else (value,):
                check_real(f"{type(self).__name__}.{name}", v, sign)
        check_real_traced(*traced)

    @abc.abstractmethod
    def vector_field(
        self,
        t: RealScalar | Real[np.ndarray, ""],
        x: Float[Array | np.ndarray, " state_dim"],
        args: Array | np.ndarray | None,
    ) -> Float[Array, " state_dim"]:
        """The time derivative `dx/dt` `(state_dim,)` at state `x` (and control `args`)."""

    def _check(self, x: object, args: object) -> tuple[Array, Array | None]:
        """`x` and `args` as arrays, `x` of shape `(state_dim,)` and `args` `None` for an
        autonomous system, else `None` (no control) or of shape `(action_dim,)`. Static
        shape checks only: they hold under `jit`, `vmap` and inside diffrax."""
        x, args = as_array("x", x), as_array("args", args, optional=True)
        control_dim = 0 if args is None else self.action_dim
        check_state_control(
            ("x", x, self.state_dim), ("args", args, control_dim), type(self).__name__
        )
        return x, args

    def _states(self, x: object) -> Array:
        """`x` as an array of states `(*batch, state_dim)`, or a `ValueError` naming it."""
        x = as_float_array("x", x)
        if x.ndim == 0 or x.shape[-1] != self.state_dim:
            raise ValueError(
                f"x must be states of shape (*batch, {self.state_dim}) of "
                f"{type(self).__name__}, got x.shape={x.shape}"
            )
        return x

    @abc.abstractmethod
    def sample_initial(self, key: PRNGKeyArray, num: IntLike) -> Float[Array, "num state_dim"]:
        """`num` initial conditions `(num, state_dim)` drawn from the paper's distribution
        (`num` an integer `>= 0`)."""


class ParabolicAttractor(DynamicalSystem):
    """`dx1/dt = mu x1`, `dx2/dt = lam (x2 - x1^2)`: a slow manifold `x2 = x1^2`.

    Admits the closed-form Koopman embedding `(x1, x2, x1^2)`. Initial conditions
    `x1, x2 ~ U[-1, 1]` (section 1.4.1).

    **Fields:**

    - `mu`, `lam`: the two rates (default -0.1 and -1), finite.
    - `dt`: the sampling interval of trajectories (default 0.01), positive.
    """

    state_dim: ClassVar[int] = 2
    constraints: ClassVar[dict[str, str]] = {"mu": "finite", "lam": "finite", "dt": "positive"}
    mu: RealScalar = -0.1
    lam: RealScalar = -1.0
    dt: RealScalar = 0.01

    def vector_field(
        self,
        t: RealScalar | Real[np.ndarray, ""],
        x: Float[Array | np.ndarray, " state_dim"],
        args: Array | np.ndarray | None,
    ) -> Float[Array, " state_dim"]:
        """`(mu x1, lam (x2 - x1^2))`, shape `(2,)`."""
        x, _ = self._check(x, args)
        return jnp.stack([self.mu * x[0], self.lam * (x[1] - x[0] ** 2)])

    def sample_initial(self, key: PRNGKeyArray, num: IntLike) -> Float[Array, "num state_dim"]:
        """`num` states `(num, 2)`: `x1, x2 ~ U[-1, 1]`."""
        check_key("key", key)
        num = check_int("num", num, minimum=0)
        return jr.uniform(key, (num, 2), minval=-1.0, maxval=1.0)


class Duffing(DynamicalSystem):
    """Unforced, undamped Duffing oscillator `x'' = x - x^3`; state `(x, x')`.

    Two centres at `(+-1, 0)` and a saddle at the origin. Initial conditions
    `x ~ U[-2, 2]`, `x' ~ U[-1, 1]`. The energy `v^2/2 - x^2/2 + x^4/4` is conserved.

    **Fields:**

    - `dt`: the sampling interval of trajectories (default 0.01), positive.
    """

    state_dim: ClassVar[int] = 2
    dt: RealScalar = 0.01

    def vector_field(
        self,
        t: RealScalar | Real[np.ndarray, ""],
        x: Float[Array | np.ndarray, " state_dim"],
        args: Array | np.ndarray | None,
    ) -> Float[Array, " state_dim"]:
        """`(x', x - x^3)`, shape `(2,)`."""
        x, _ = self._check(x, args)
        return jnp.stack([x[1], x[0] - x[0] ** 3])

    def sample_initial(self, key: PRNGKeyArray, num: IntLike) -> Float[Array, "num state_dim"]:
        """`num` states `(num, 2)`: `x ~ U[-2, 2]`, `x' ~ U[-1, 1]`."""
        check_key("key", key)
        num = check_int("num", num, minimum=0)
        lo = jnp.array([-2.0, -1.0])
        return jr.uniform(key, (num, 2), minval=lo, maxval=-lo)


class LotkaVolterra(DynamicalSystem):
    """Predator-prey `x1' = alpha x1 - beta x1 x2`, `x2' = delta x1 x2 - gamma x2`.

    All four rates default to 0.2; initial conditions `x1, x2 ~ U[0.02, 3]`. The
    quantity `delta x1 - gamma log x1 + beta x2 - alpha log x2` is conserved.

    **Fields:**

    - `alpha`, `beta`, `gamma`, `delta`: the rates (default 0.2 each), positive.
    - `dt`: the sampling interval of trajectories (default 0.01), positive.
    """

    state_dim: ClassVar[int] = 2
    constraints: ClassVar[dict[str, str]] = dict.fromkeys(
        ("alpha", "beta", "gamma", "delta", "dt"), "positive"
    )
    alpha: RealScalar = 0.2
    beta: RealScalar = 0.2
    gamma: RealScalar = 0.2
    delta: RealScalar = 0.2
    dt: RealScalar = 0.01

    def vector_field(
        self,
        t: RealScalar | Real[np.ndarray, ""],
        x: Float[Array | np.ndarray, " state_dim"],
        args: Array | np.ndarray | None,
    ) -> Float[Array, " state_dim"]:
        """`(alpha x1 - beta x1 x2, delta x1 x2 - gamma x2)`, shape `(2,)`."""
        x, _ = self._check(x, args)
        x1, x2 = x[0], x[1]
        return jnp.stack(
            [self.alpha * x1 - self.beta * x1 * x2, self.delta * x1 * x2 - self.gamma * x2]
        )

    def sample_initial(self, key: PRNGKeyArray, num: IntLike) -> Float[Array, "num state_dim"]:
        """`num` states `(num, 2)`: `x1, x2 ~ U[0.02, 3]`."""
        check_key("key", key)
        num = check_int("num", num, minimum=0)
        return jr.uniform(key, (num, 2), minval=0.02, maxval=3.0)

    def invariant(self, x: Float[Array, "*batch 2"]) -> Float[Array, "*batch"]:
        """The conserved `delta x1 - gamma log x1 + beta x2 - alpha log x2`, shape `(*batch,)`,
        of states `x` `(*batch, 2)`: defined for positive populations (the orbits of
        positive states stay positive); inf at a zero population, NaN at a negative one."""
        x = self._states(x)
        x1, x2 = x[..., 0], x[..., 1]
        return (
            self.delta * x1 - self.gamma * jnp.log(x1) + self.beta * x2 - self.alpha * jnp.log(x2)
        )


_PENDULUM = dict.fromkeys(("g", "length", "dt"), "positive")


class Pendulum(DynamicalSystem):
    """Frictionless pendulum `theta'' = -(g / length) sin(theta)`; state `(theta, omega)`.

    `theta = 0` hangs down; the pole is released at rest within `max_offset_deg`
    (default 10 degrees) of `release_deg`, by default the inverted position
    `theta = pi` (180 degrees; section 1.4.1). `release_deg=0` releases it near the
    bottom instead, where it swings as an almost linear oscillator. `energy` is
    conserved.

    **Fields:**

    - `g`: gravitational acceleration (default 9.81), positive.
    - `length`: the pole's length (default 1), positive.
    - `max_offset_deg`: the largest release offset from `release_deg`, in degrees
        (default 10), `>= 0`.
    - `release_deg`: the centre of the release angles, in degrees (default 180), finite.
    - `dt`: the sampling interval of trajectories (default 0.01), positive.
    """

    state_dim: ClassVar[int] = 2
    constraints: ClassVar[dict[str, str]] = {
        **_PENDULUM,
        "max_offset_deg": "nonnegative",
        "release_deg": "finite",
    }
    g: RealScalar = 9.81
    length: RealScalar = 1.0
    max_offset_deg: RealScalar = 10.0
    release_deg: RealScalar = 180.0
    dt: RealScalar = 0.01

    def vector_field(
        self,
        t: RealScalar | Real[np.ndarray, ""],
        x: Float[Array | np.ndarray, " state_dim"],
        args: Array | np.ndarray | None,
    ) -> Float[Array, " state_dim"]:
        """`(omega, -(g / length) sin(theta))`, shape `(2,)`."""
        x, _ = self._check(x, args)
        return jnp.stack([x[1], -(self.g / self.length) * jnp.sin(x[0])])

    def sample_initial(self, key: PRNGKeyArray, num: IntLike) -> Float[Array, "num state_dim"]:
        """`num` states `(num, 2)` released at rest: `theta` uniform within `max_offset_deg`
        of `release_deg`, `omega = 0`."""
        check_key("key", key)
        num = check_int("num", num, minimum=0)
        # Array fields are traced under jit.
        offset, centre = jnp.deg2rad(self.max_offset_deg), jnp.deg2rad(self.release_deg)
        theta = centre + jr.uniform(key, (num,), minval=-offset, maxval=offset)
        return jnp.stack([theta, jnp.zeros_like(theta)], axis=-1)

    def energy(self, x: Float[Array, "*batch 2"]) -> Float[Array, "*batch"]:
        """Energy per unit `m length^2`, `omega^2 / 2 - (g / length) cos(theta)`, shape
        `(*batch,)`, of states `x` `(*batch, 2)`."""
        x = self._states(x)
        return 0.5 * x[..., 1] ** 2 - (self.g / self.length) * jnp.cos(x[..., 0])


class ControlledPendulum(DynamicalSystem):
    """Damped pendulum driven by a torque `u`: `theta'' = -(g/l) sin(theta) - b omega + u`.

    One control input (`action_dim = 1`), passed as `args` of shape `(1,)` to
    `vector_field` (`None`: no torque). Initial
    conditions: `theta ~ U[-pi, pi]`, `omega ~ U[-1, 1]`; `sample_actions` draws torques
    `U[-max_torque, max_torque]`, held constant over each sampling interval.

    **Fields:**

    - `g`: gravitational acceleration (default 9.81), positive.
    - `length`: the pole's length `l` (default 1), positive.
    - `damping`: the friction coefficient `b` (default 0.1), `>= 0`.
    - `max_torque`: the bound of `sample_actions`' torques (default 2), `>= 0`.
    - `dt`: the sampling interval of trajectories (default 0.01), positive.
    """

    state_dim: ClassVar[int] = 2
    action_dim: ClassVar[int] = 1
    constraints: ClassVar[dict[str, str]] = {
        **_PENDULUM,
        "damping": "nonnegative",
        "max_torque": "nonnegative",
    }
    g: RealScalar = 9.81
    length: RealScalar = 1.0
    damping: RealScalar = 0.1
    max_torque: RealScalar = 2.0
    dt: RealScalar = 0.01

    def vector_field(
        self,
        t: RealScalar | Real[np.ndarray, ""],
        x: Float[Array | np.ndarray, " state_dim"],
        args: Array | np.ndarray | None,
    ) -> Float[Array, " state_dim"]:
        """`(omega, -(g / length) sin(theta) - damping omega + u)` with the torque
        `u = args[0]` (`args` of shape `(1,)`, or `None`: no torque), shape `(2,)`."""
        if args is not None and jnp.shape(args) != (self.action_dim,):
            raise ValueError(
                f"args is the torque u, shape ({self.action_dim},) (or None: no torque), "
                f"got args.shape={jnp.shape(args)}"
            )
        x, args = self._check(x, args)
        u = 0.0 if args is None else args[0]
        return jnp.stack([x[1], -(self.g / self.length) * jnp.sin(x[0]) - self.damping * x[1] + u])

    def sample_initial(self, key: PRNGKeyArray, num: IntLike) -> Float[Array, "num state_dim"]:
        """`num` states `(num, 2)`: `theta ~ U[-pi, pi]`, `omega ~ U[-1, 1]`."""
        check_key("key", key)
        num = check_int("num", num, minimum=0)
        lo = jnp.array([-math.pi, -1.0])
        return jr.uniform(key, (num, 2), minval=lo, maxval=-lo)

    def sample_actions(
        self, key: PRNGKeyArray, num: IntLike, steps: IntLike
    ) -> Float[Array, "num steps 1"]:
        """Random piecewise-constant torques `(num, steps, 1)`, one per sampling interval."""
        check_key("key", key)
        num, steps = check_int("num", num, minimum=0), check_int("steps", steps, minimum=0)
        return jr.uniform(key, (num, steps, 1), minval=-self.max_torque, maxval=self.max_torque)


class Lorenz63(DynamicalSystem):
    """Lorenz '63 `x' = sigma (y - x)`, `y' = x (rho - z) - y`, `z' = x y - beta z`.

    Chaotic at the original parameters (10, 28, 8/3); initial conditions
    `(0, 1, 1.05) + N(0, 1)`.

    **Fields:**

    - `sigma`, `rho`, `beta`: the parameters (default 10, 28 and 8/3), positive.
    - `dt`: the sampling interval of trajectories (default 0.02), positive.
    """

    state_dim: ClassVar[int] = 3
    constraints: ClassVar[dict[str, str]] = dict.fromkeys(
        ("sigma", "rho", "beta", "dt"), "positive"
    )
    sigma: RealScalar = 10.0
    rho: RealScalar = 28.0
    beta: RealScalar = 8.0 / 3.0
    dt: RealScalar = 0.02

    def vector_field(
        self,
        t: RealScalar | Real[np.ndarray, ""],
        x: Float[Array | np.ndarray, " state_dim"],
        args: Array | np.ndarray | None,
    ) -> Float[Array, " state_dim"]:
        """`(sigma (y - x), x (rho - z) - y, x y - beta z)`, shape `(3,)`."""
        x, _ = self._check(x, args)
        return jnp.stack(
            [
                self.sigma * (x[1] - x[0]),
                x[0] * (self.rho - x[2]) - x[1],
                x[0] * x[1] - self.beta * x[2],
            ]
        )

    def sample_initial(self, key: PRNGKeyArray, num: IntLike) -> Float[Array, "num state_dim"]:
        """`num` states `(num, 3)`: `(0, 1, 1.05) + N(0, 1)`."""
        check_key("key", key)
        num = check_int("num", num, minimum=0)
        return jnp.array([0.0, 1.0, 1.05]) + jr.normal(key, (num, 3))


SYSTEMS: dict[str, type[DynamicalSystem]] = {
    "parabolic": ParabolicAttractor,
    "pendulum": Pendulum,
    "duffing": Duffing,
    "lotka_volterra": LotkaVolterra,
    "lorenz": Lorenz63,
    "controlled_pendulum": ControlledPendulum,
}
"""The systems by name (the `--system` choices of `python -m lineax_seq koopman`, and
`controlled_pendulum`): each a [`lineax_seq.DynamicalSystem`][] class whose defaults
are the paper's parameters. [`lineax_seq.get_system`][] builds one."""


def get_system(name: str, **params: RealScalar) -> DynamicalSystem:
    """The system called `name` with the paper's parameters, except those given as
    keywords, e.g. `get_system("pendulum", g=1.0)`.

    **Arguments:**

    - `name`: one of `SYSTEMS` (`"parabolic"`, `"pendulum"`, `"duffing"`,
        `"lotka_volterra"`, `"lorenz"`, `"controlled_pendulum"`).
    - `**params`: the system's parameters to override (its dataclass fields, e.g. `dt`).

    **Returns:**

    A [`lineax_seq.DynamicalSystem`][].

    **Raises:**

    `TypeError` / `ValueError` for a name that is not a system, a keyword that is not one
    of its parameters (the error lists them), or a value the class refuses.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, one of {sorted(SYSTEMS)}; got name={name!r}")
    check_choice("name", name, tuple(sorted(SYSTEMS)))
    cls = SYSTEMS[name]
    fields = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(params) - set(fields))
    if unknown:
        verb = "is not a parameter" if len(unknown) == 1 else "are not parameters"
        raise ValueError(
            f"{', '.join(unknown)} {verb} of the {name!r} system ({cls.__name__}); "
            f"its parameters are {fields}"
        )
    return cls(**params)
