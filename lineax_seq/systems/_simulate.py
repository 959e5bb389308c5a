"""Trajectory simulation with diffrax at tight tolerance."""

import math

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
from beartype import beartype
from jaxtyping import Array, Float, PRNGKeyArray, jaxtyped

from ._systems import DynamicalSystem


def _check_state(system: DynamicalSystem, x0: Array) -> Array:
    if x0.shape != (system.state_dim,):
        raise ValueError(
            f"x0 has shape {x0.shape}, but {type(system).__name__} needs shape "
            f"({system.state_dim},)"
        )
    if isinstance(x0, jax.core.Tracer):
        return eqx.error_if(x0, ~jnp.all(jnp.isfinite(x0)), "x0 contains NaN or inf values")
    if not bool(jnp.all(jnp.isfinite(x0))):
        raise ValueError(f"x0 contains NaN or inf values: {x0}")
    return x0


def _check_steps(steps: int, dt: float | None) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
        raise ValueError(f"steps={steps!r} must be a positive int")
    if dt is not None and not 0 < dt < math.inf:
        raise ValueError(f"dt={dt!r} must be positive and finite (or None: system.dt)")


@jaxtyped(typechecker=beartype)
def simulate(
    system: DynamicalSystem,
    x0: Float[Array, " state_dim"],
    steps: int,
    *,
    actions: Float[Array, "steps action_dim"] | None = None,
    dt: float | int | None = None,
    solver: diffrax.AbstractSolver | None = None,
    rtol: float = 1e-7,
    atol: float = 1e-9,
    max_steps: int = 100_000,
) -> Float[Array, "times state_dim"]:
    """Integrate `system` from `x0` and sample the state every `dt`.

    Adaptive Runge-Kutta (default `diffrax.Dopri8`) with a PID step-size controller at
    tight tolerance. With `actions`, the control is held constant over each sampling
    interval (zero-order hold) and the intervals are integrated one after another, so the
    solver never steps across a discontinuity.

    **Arguments:**

    - `system`: the dynamical system.
    - `x0`: initial state, shape `(state_dim,)`, finite.
    - `steps`: number of sampling intervals, positive.
    - `actions`: control inputs `(steps, action_dim)`, one per interval, for controlled
        systems; must be `None` for autonomous ones.
    - `dt`: sampling interval, positive (default `system.dt`).
    - `solver`, `rtol`, `atol`, `max_steps`: passed to `diffrax.diffeqsolve`.

    **Returns:**

    The states at times `0, dt, ..., steps dt`, shape `(steps + 1, state_dim)`.
    """
    x0 = _check_state(system, x0)
    _check_steps(steps, dt)
    if (actions is None) != (system.action_dim == 0):
        raise ValueError(
            f"actions must be given exactly when the system is controlled; "
            f"{type(system).__name__}.action_dim={system.action_dim}, actions is "
            f"{'None' if actions is None else 'given'}"
        )
    if actions is not None and actions.shape != (steps, system.action_dim):
        raise ValueError(
            f"actions has shape {actions.shape}, expected (steps, action_dim) = "
            f"{(steps, system.action_dim)}"
        )
    dt = system.dt if dt is None else dt
    solver = diffrax.Dopri8() if solver is None else solver
    term = diffrax.ODETerm(system.vector_field)
    controller = diffrax.PIDController(rtol=rtol, atol=atol)
    if actions is None:
        ts = dt * jnp.arange(steps + 1, dtype=x0.dtype)
        sol = diffrax.diffeqsolve(
            term,
            solver,
            t0=0.0,
            t1=ts[-1],
            dt0=dt,
            y0=x0,
            saveat=diffrax.SaveAt(ts=ts),
            stepsize_controller=controller,
            max_steps=max_steps,
        )
        return sol.ys

    def interval(x, u):
        sol = diffrax.diffeqsolve(
            term,
            solver,
            t0=0.0,
            t1=dt,
            dt0=dt,
            y0=x,
            args=u,
            stepsize_controller=controller,
            max_steps=max_steps,
        )
        x_next = sol.ys[-1]
        return x_next, x_next

    _, xs = jax.lax.scan(interval, x0, actions)
    return jnp.concatenate([x0[None], xs])


@eqx.filter_jit
def sample_trajectories(
    system: DynamicalSystem,
    key: PRNGKeyArray,
    num: int,
    steps: int,
    *,
    dt: float | None = None,
) -> tuple[Float[Array, "num times state_dim"], Float[Array, "num intervals action_dim"] | None]:
    """Draw `num` initial conditions (and random actions) and simulate `steps` intervals.

    **Arguments:**

    - `system`: the dynamical system; its `sample_initial` (and, for controlled systems,
        `sample_actions`) provide the randomness.
    - `key`: PRNG key.
    - `num`: number of trajectories.
    - `steps`: number of sampling intervals per trajectory.
    - `dt`: sampling interval (default `system.dt`).

    **Returns:**

    `(states, actions)`: states `(num, steps + 1, state_dim)` and actions
    `(num, steps, action_dim)`, or `None` for autonomous systems.
    """
    if isinstance(num, bool) or not isinstance(num, int) or num <= 0:
        raise ValueError(f"num={num!r} must be a positive int")
    _check_steps(steps, dt)
    init_key, action_key = jr.split(key)
    x0 = system.sample_initial(init_key, num)
    if system.action_dim == 0:
        xs = jax.vmap(lambda x: simulate(system, x, steps, dt=dt))(x0)
        return xs, None
    actions = system.sample_actions(action_key, num, steps)
    xs = jax.vmap(lambda x, u: simulate(system, x, steps, actions=u, dt=dt))(x0, actions)
    return xs, actions
