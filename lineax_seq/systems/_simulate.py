"""Trajectory simulation with diffrax at tight tolerance."""

from typing import cast

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from beartype import beartype
from jaxtyping import Array, Float, PRNGKeyArray, jaxtyped

from .._checks import IntLike, RealScalar, check_int, check_key, check_real, short_repr
from .._numerics import work_dtype
from ._diffeq import (
    check_actions,
    check_solve_options,
    check_x0,
    default_controller,
    solve_adjoint,
)
from ._systems import DynamicalSystem


def _check_system(system: object) -> None:
    if not isinstance(system, DynamicalSystem):
        raise TypeError(
            "system must be a lineax_seq.DynamicalSystem, e.g. lineax_seq.get_system("
            f"'duffing'), got system={short_repr(system)}"
        )


def _check_steps(steps: object, dt: object) -> tuple[int, float | None]:
    """`(steps, dt)` as an `int` and a `float` (or `None`: `system.dt`), checked."""
    return check_int("steps", steps), None if dt is None else check_real("dt", dt)


# The default PID controller's tolerances.
_RTOL, _ATOL = 1e-7, 1e-9


def _check_tolerances(rtol: object, atol: object, used: bool) -> tuple[float, float]:
    """`(rtol, atol)` as floats (`None`: the defaults), checked; given ones only where
    `used` (the default PID controller runs), else they would be silently ignored."""
    given = [name for name, value in (("rtol", rtol), ("atol", atol)) if value is not None]
    if given and not used:
        raise ValueError(
            f"{' and '.join(given)} set the default PIDController's tolerances, which "
            "is not used with a stepsize_controller given or a solver without an error "
            "estimate: set the tolerances in your stepsize_controller instead"
        )
    rtol = _RTOL if rtol is None else check_real("rtol", rtol, "nonnegative")
    atol = _ATOL if atol is None else check_real("atol", atol, "nonnegative")
    if rtol == 0 and atol == 0:
        raise ValueError("rtol=0 and atol=0: at least one tolerance must be positive")
    return rtol, atol


@jaxtyped(typechecker=beartype)
def simulate(
    system: DynamicalSystem,
    x0: Float[Array | np.ndarray, " state_dim"],
    steps: IntLike,
    *,
    actions: Float[Array | np.ndarray, "steps action_dim"] | None = None,
    dt: RealScalar | None = None,
    solver: diffrax.AbstractSolver | None = None,
    rtol: RealScalar | None = None,
    atol: RealScalar | None = None,
    max_steps: IntLike = 100_000,
    stepsize_controller: diffrax.AbstractStepSizeController | None = None,
    dt0: RealScalar | None = None,
    adjoint: diffrax.AbstractAdjoint | None = None,
) -> Float[Array, "times state_dim"]:
    """Integrate `system` from `x0` and sample the state every `dt`.

    Adaptive Runge-Kutta (default `diffrax.Dopri8`) with a PID step-size controller at
    tight tolerance; a solver without an error estimate (e.g. `diffrax.Euler()`) takes,
    by default, one fixed step per sampling interval (pass
    `stepsize_controller=diffrax.ConstantStepSize()` and a smaller `dt0` for finer
    steps). With `actions`, the control is held constant
    over each sampling interval (zero-order hold) and the intervals
    `[i dt, (i + 1) dt]` are integrated one after another, so the solver never steps
    across a discontinuity.

    **Arguments:**

    - `system`: the dynamical system.
    - `x0`: initial state, shape `(state_dim,)`, finite (a JAX or NumPy array).
    - `steps`: number of sampling intervals, a positive (Python or NumPy) integer.
    - `actions`: control inputs `(steps, action_dim)`, one per interval, finite, for
        controlled systems; must be `None` for autonomous ones.
    - `dt`: sampling interval, positive and finite (default `system.dt`).
    - `solver`: a diffrax solver (default `diffrax.Dopri8()`).
    - `rtol`, `atol`: tolerances of the default PID controller (default `1e-7`,
        `1e-9`), `>= 0` and not both 0; only for an adaptive solver without a
        `stepsize_controller` (elsewhere they would be ignored: an error).
    - `max_steps`: passed to `diffrax.diffeqsolve`, a positive integer.
    - `stepsize_controller`: overrides the default controller (`PIDController(rtol,
        atol)` for adaptive solvers, `StepTo` the sampling times otherwise); not
        `StepTo` with `actions` (each interval is solved on its own). A `StepTo` given
        must start and end on the sampling times as computed here, `dt *
        jnp.arange(steps + 1, dtype=x0.dtype)` (diffrax requires its first and last
        times to be `t0` and `t1` exactly; `jnp.linspace` rounds differently).
    - `dt0`: the initial (or constant) step, positive (default `dt`); not with `StepTo`
        (given or default), which fixes the steps itself.
    - `adjoint`: passed to `diffrax.diffeqsolve` (default diffrax's
        `RecursiveCheckpointAdjoint`, reverse mode only: give `diffrax.ForwardMode()` for
        `jax.jvp` / `jax.jacfwd`).

    **Returns:**

    The states at times `0, dt, ..., steps dt`, shape `(steps + 1, state_dim)`, in the
    dtype of `x0` (promoted with `actions` and the system's parameters). Half-precision
    states (bfloat16, float16) are integrated in float32, whose result is cast back.
    """
    _check_system(system)
    check_solve_options(solver, stepsize_controller, adjoint)
    x0 = check_x0(jnp.asarray(x0), system.state_dim, type(system).__name__)
    steps, dt = _check_steps(steps, dt)
    max_steps = check_int("max_steps", max_steps)
    dt0 = None if dt0 is None else check_real("dt0", dt0)
    solver = diffrax.Dopri8() if solver is None else solver
    adaptive = isinstance(solver, diffrax.AbstractAdaptiveSolver)
    rtol, atol = _check_tolerances(rtol, atol, adaptive and stepsize_controller is None)
    step_to = isinstance(stepsize_controller, diffrax.StepTo) or (
        stepsize_controller is None and not adaptive
    )
    if step_to and dt0 is not None:
        raise ValueError(
            f"dt0={dt0!r} has no effect with StepTo (the default for a solver without an "
            "error estimate): pass stepsize_controller=diffrax.ConstantStepSize() with it"
        )
    if isinstance(stepsize_controller, diffrax.StepTo) and actions is not None:
        raise ValueError(
            "stepsize_controller=StepTo(...) cannot be used with actions (each sampling "
            "interval is solved on its own): use diffrax.ConstantStepSize() and dt0"
        )
    if (actions is None) != (system.action_dim == 0):
        raise ValueError(
            f"actions must be given exactly when the system is controlled; "
            f"{type(system).__name__}.action_dim={system.action_dim}, actions is "
            f"{'None' if actions is None else 'given'}"
        )
    if actions is not None:
        actions = check_actions(actions, steps, system.action_dim)
        # One dtype for the state and the controls (NumPy's float64 actions with a
        # float32 state compute in float64), so the scan's carry keeps its dtype.
        dtype = jnp.result_type(x0, actions)
        x0, actions = x0.astype(dtype), actions.astype(dtype)
    # Likewise for the field's parameters (NumPy float64 ones, e.g. from `np.linspace`,
    # with a float32 state under x64 give a float64 field): the state takes its dtype.
    u0 = None if actions is None else actions[0]
    field = jax.eval_shape(system.vector_field, jnp.zeros((), x0.dtype), x0, u0)
    out_dtype = jnp.result_type(x0, field.dtype)
    # Half precision (bfloat16, float16) resolves neither the times nor the tolerances
    # (the default PID controller then stalls until max_steps): integrate in float32,
    # return out_dtype.
    dtype = jnp.dtype(work_dtype(out_dtype))
    x0, actions = x0.astype(dtype), None if actions is None else actions.astype(dtype)
    # Times in the state's dtype, also for a NumPy float64 `system.dt` under x64 (float64
    # times made diffrax return float64 states, which the scan over intervals refused).
    dt = jnp.asarray(system.dt if dt is None else dt, x0.dtype)
    # (diffrax's hint allows NumPy times, which diffrax never passes)
    term = diffrax.ODETerm(system.vector_field)  # pyright: ignore[reportArgumentType]
    ts = dt * jnp.arange(steps + 1, dtype=x0.dtype)

    def solve(x, times, args, saveat):
        controller = stepsize_controller
        if controller is None:  # PID; without an error estimate, onto the sampling times
            controller = default_controller(solver, rtol, atol, diffrax.StepTo(times))
        sol = diffrax.diffeqsolve(
            term,
            solver,
            t0=times[0],
            t1=times[-1],
            dt0=None if step_to else (dt if dt0 is None else dt0),
            y0=x,
            args=args,
            saveat=saveat,
            stepsize_controller=controller,
            max_steps=max_steps,
            adjoint=solve_adjoint(adjoint),
        )
        return cast(Array, sol.ys)

    if actions is None:
        return solve(x0, ts, None, diffrax.SaveAt(ts=ts)).astype(out_dtype)

    def interval(x, inputs):
        t0, t1, u = inputs
        x_next = solve(x, jnp.stack([t0, t1]), u, diffrax.SaveAt(t1=True))[-1]
        return x_next, x_next

    # Interval i runs from t_i = i dt to t_{i+1}, so time-dependent fields see the time.
    _, xs = jax.lax.scan(interval, x0, (ts[:-1], ts[1:], actions))
    return jnp.concatenate([x0[None], xs]).astype(out_dtype)


def sample_trajectories(
    system: DynamicalSystem,
    key: PRNGKeyArray,
    num: IntLike,
    steps: IntLike,
    *,
    dt: RealScalar | None = None,
) -> tuple[Float[Array, "num times state_dim"], Float[Array, "num intervals action_dim"] | None]:
    """Draw `num` initial conditions (and random actions) and simulate `steps` intervals.

    **Arguments:**

    - `system`: the dynamical system; its `sample_initial` (and, for controlled systems,
        `sample_actions`) provide the randomness.
    - `key`: one PRNG key, `jax.random.key(seed)` (or a raw `uint32` key of
        `jax.random.PRNGKey`).
    - `num`: number of trajectories, a positive int.
    - `steps`: number of sampling intervals per trajectory, a positive int.
    - `dt`: sampling interval (default `system.dt`).

    **Returns:**

    `(states, actions)`: states `(num, steps + 1, state_dim)` and actions
    `(num, steps, action_dim)`, or `None` for autonomous systems.
    """
    _check_system(system)
    if system.action_dim and not callable(getattr(system, "sample_actions", None)):
        raise TypeError(
            f"{type(system).__name__} has action_dim={system.action_dim} but no "
            "sample_actions(key, num, steps) method, which draws the (num, steps, "
            "action_dim) controls; define it, or simulate chosen actions with simulate"
        )
    check_key("key", key)
    num = check_int("num", num)
    steps, dt = _check_steps(steps, dt)
    # Static Python numbers (NumPy scalars would be traced as jit arguments).
    return _sample_trajectories(system, key, num, steps, dt)


@eqx.filter_jit
def _sample_trajectories(system, key, num, steps, dt):
    init_key, action_key = jr.split(key)
    x0 = system.sample_initial(init_key, num)
    if system.action_dim == 0:
        xs = jax.vmap(lambda x: simulate(system, x, steps, dt=dt))(x0)
        return xs, None
    actions = system.sample_actions(action_key, num, steps)
    xs = jax.vmap(lambda x, u: simulate(system, x, steps, actions=u, dt=dt))(x0, actions)
    return xs, actions
