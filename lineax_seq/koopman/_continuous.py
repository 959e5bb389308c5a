"""Unrolling Koopman models in continuous time: `diffrax.diffeqsolve` or the exact flow,
between reencodings."""

import math
import typing
from typing import NamedTuple, cast, overload

import diffrax
import equinox as eqx
import jax
import jax.core
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from beartype import beartype
from jaxtyping import Array, Float, Real, jaxtyped

from .._checks import (
    IntLike,
    RealScalar,
    check_bool,
    check_instance,
    check_option,
    check_optional_int,
    check_real,
    check_real_or_traced,
    fail_if,
)
from .._numerics import work_dtype
from ..systems import _diffeq
from ._autoencoder import KoopmanAutoencoder, UnitNormLinear
from ._dynamics import _HIGHEST, LinearKoopmanDynamics, matmul
from ._unroll import _check_actions, _concrete, promote


def _eps(dtype: object) -> float:
    return float(jnp.finfo(dtype).eps)


def _given_dtype(ts: object) -> np.dtype | None:
    """The floating dtype `ts` was given in (`None` for integers, which are exact)."""
    dtype = ts.dtype if isinstance(ts, jax.Array | np.ndarray) else np.asarray(ts).dtype
    return dtype if jnp.issubdtype(dtype, jnp.floating) else None


def _check_reencode_dt(reencode_dt: object) -> tuple[float | None, float]:
    """`(reencode_dt, eps)`: the interval as a `float` (or `None`), checked, and the
    relative precision it came in: float32's machine epsilon for a NumPy or JAX float32
    scalar, else 0 (a Python number, or a float64 one, is exact). A half-precision one is
    refused: its rounding, summed over the intervals, soon exceeds the spacing of the
    output times."""
    if reencode_dt is None:
        return None, 0.0
    value = check_real("reencode_dt", reencode_dt)
    dtype = getattr(reencode_dt, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        return value, 0.0
    eps, eps32 = _eps(dtype), _eps(np.float32)
    if eps > eps32:
        raise ValueError(
            f"reencode_dt={value!r} is a {np.dtype(dtype)} scalar, whose relative rounding, "
            f"{eps / 2:.1e}, summed over the intervals misplaces the reencoding times: pass a "
            "Python float (or a float32 / float64 scalar)"
        )
    return value, eps32 if eps == eps32 else 0.0


def _segments(
    ts: Array,
    ts_host: np.ndarray | None,
    reencode_dt: float | None,
    tolerance,
    num_segments: int | None,
) -> tuple[Array, int]:
    """`(ts, num)`: the number of reencoding segments, checked against `ts`."""
    if reencode_dt is None:
        if num_segments not in (None, 1):
            raise ValueError(f"num_segments={num_segments} must be 1 (or None) without reencode_dt")
        return ts, 1
    if ts_host is None:
        if num_segments is None:
            raise ValueError(
                "with a traced ts (under jit: an argument, or computed with jax.numpy "
                "inside; build it with NumPy to keep it concrete), pass num_segments="
                "ceil((ts[-1] - ts[0]) / reencode_dt) explicitly, since it fixes array shapes"
            )
        # Too few segments would stop reencoding early: an error, not a wrong answer.
        short = ts[-1] - ts[0] > (num_segments + tolerance[-1]) * reencode_dt
        message = f"num_segments={num_segments} is fewer than ceil((ts[-1] - ts[0]) / reencode_dt)"
        fail_if(short, message)
        return ts, num_segments
    span = float(ts_host[-1] - ts_host[0])
    num = max(1, math.ceil(span / reencode_dt - float(tolerance[-1])))
    if num_segments is not None and num_segments < num:
        raise ValueError(
            f"num_segments={num_segments}, but ts spans {span:g} = {num} segments of "
            f"reencode_dt={reencode_dt!r} (num_segments is needed only for a traced ts)"
        )
    return ts, num


# Reencoding times computed as `jnp.linspace` or `t0 + dt * arange` land up to ~1.5 units
# in the last place of `max |ts|` past the exact ones, ~3 with the arithmetic on a traced
# `ts`; and a `reencode_dt` given in float32 (from float32 data) is off by float32 units
# of the span, even for float64 times. 16 of each: 1.9e-6 at `max |ts| = 1` in float32
# (the former `1e-4` merged times far apart).
_ULPS = 16


def _tolerance(ts, rounding_dtype, reencode_dt: float, reencode_eps: float):
    """How far past a reencoding time, in segments, each time `t` of `ts` still counts as
    equal to it: `_ULPS` machine epsilons of `rounding_dtype` relative to
    `max(|t|, |ts[0]|)` (the rounding of computed times, in the dtype they were given in,
    or are promoted to if lower) plus `_ULPS` units of `t - ts[0]` in `reencode_eps` (the
    precision `reencode_dt` came in: 0 for a Python number, float32's for a float32 one),
    and no more (a later time is reencoded). Per time, so that a late time does not widen an
    early one's. The last time's counts the segments. A `ValueError` (at run time for
    traced `ts`) if the times span a reencoding time and the last time's tolerance
    reaches half a segment: the times cannot then be placed on the grid."""
    xp = np if isinstance(ts, np.ndarray) else jnp
    eps = _eps(rounding_dtype)
    rounding = _ULPS * eps * xp.maximum(xp.abs(ts), xp.abs(ts[0]))
    interval = _ULPS * reencode_eps * (ts - ts[0])
    tolerance = (rounding + interval) / reencode_dt
    unresolved = (tolerance[-1] >= 0.5) & (ts[-1] - ts[0] > reencode_dt)
    times = (
        f"{np.dtype(rounding_dtype)} times are known only to {_ULPS} machine epsilons of "
        "their size, half an interval or more here: pass times of a wider dtype (float64 "
        "needs jax_enable_x64)"
    )
    shifted = "ts - ts[0] (the model is autonomous: the same states)"
    interval_dt = (
        f"a float32 reencode_dt summed over this many intervals is known only to within "
        f"half an interval ({_ULPS} float32 units of the span): pass it as a Python float"
    )
    intro = (
        f"reencode_dt={reencode_dt!r} cannot place the reencoding times among the output times: "
    )
    if xp is jnp:
        fail_if(
            unresolved, f"{intro}{times}, or, if they start far from 0, {shifted}; or {interval_dt}"
        )
        return tolerance
    if unresolved:
        # Shifted to start at 0, the times' rounding is that of their span.
        shift_helps = _ULPS * eps * (ts[-1] - ts[0]) + interval[-1] < 0.5 * reencode_dt
        cause = times + (f", or {shifted}" if shift_helps else "")
        cause = interval_dt if interval[-1] > rounding[-1] else cause
        raise ValueError(f"{intro}{cause} (ts from {ts[0]:.9g} to {ts[-1]:.9g})")
    return tolerance


@overload
def _reencoding_grid(
    ts: np.ndarray, reencode_dt: float | None, num: int, tolerance
) -> tuple[np.ndarray, np.ndarray]: ...
@overload
def _reencoding_grid(
    ts: Array, reencode_dt: float | None, num: int, tolerance
) -> tuple[Array, Array]: ...
def _reencoding_grid(
    ts: Array | np.ndarray, reencode_dt: float | None, num: int, tolerance
) -> tuple[Array | np.ndarray, Array | np.ndarray]:
    """Reencoding times `taus` `(num + 1,)` and the segment of every output time.

    A time `t` belongs to segment `j`, `(tau_j, tau_{j+1}]`, where a time up to
    `tolerance` segments past `tau_{j+1}` counts as equal to it: the segment then ends
    at that time (it is the reencoding time), so every time lies in its segment and is
    evaluated at its own offset `t - tau_j` on every path. Works on host arrays (`np`)
    or traced ones (`jnp`) alike.
    """
    xp = np if isinstance(ts, np.ndarray) else jnp
    if reencode_dt is None:
        return xp.stack([ts[0], ts[-1]]), xp.zeros(ts.shape, np.int32)
    taus = xp.minimum(ts[0] + reencode_dt * xp.arange(num + 1, dtype=ts.dtype), ts[-1])
    taus = xp.concatenate([taus[:-1], ts[-1:]])
    seg = xp.ceil((ts - ts[0]) / reencode_dt - tolerance).astype(np.int32) - 1
    seg = xp.clip(seg, 0, num - 1)
    # Each segment ends at the latest of its reencoding time and its own output times.
    if isinstance(taus, np.ndarray):
        np.maximum.at(taus, seg + 1, ts)
    else:
        taus = taus.at[seg + 1].max(ts)
    return taus, seg


def _distinct(values: np.ndarray, resolution: float) -> tuple[np.ndarray, np.ndarray]:
    """`(distinct, index)` with `values == distinct[index]` up to `resolution`.

    Values closer than `resolution` may share an entry; values at least `2 resolution`
    apart never do.
    """
    keys = np.round(values / resolution)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return values[first], inverse.reshape(-1)


def _segment_times(
    taus: np.ndarray, seg: np.ndarray, ts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per segment, its output times padded with its end time, then the end time.

    Returns `save_ts` `(num, width + 1)` and the position of every `ts[i]` in the row of
    its segment. `width`, the most times in one segment rounded up to a power of two, is
    what the compiled solve's shape depends on, with the number of segments: other `ts`
    with the same two compile no new solve.
    """
    num = taus.shape[0] - 1
    counts = np.bincount(seg, minlength=num)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    position = np.arange(ts.shape[0]) - first[seg]
    width = 1 << (int(counts.max()) - 1).bit_length()
    save_ts = np.repeat(taus[1:, None], width + 1, axis=1)
    save_ts[seg, position] = ts
    return save_ts, position


def _increasing(host: np.ndarray) -> bool:
    return bool(np.all(np.isfinite(host)) and np.all(host[1:] > host[:-1]))


_OR = (
    "raise max_steps, loosen the step-size controller's tolerances, or pass throw=False "
    "(NaN states from the failure on)"
)


def _check_ts(ts: Array, host: np.ndarray | None, given: np.ndarray | None) -> Array:
    """`ts`, checked to be finite and strictly increasing in the dtype it is computed in
    (`host`, on the host); `given` is the host array it came as, whose cast can merge
    close times."""
    if ts.shape[0] < 1:
        raise ValueError("ts must contain at least one time")
    if host is None:
        bad = jnp.any(ts[1:] <= ts[:-1]) | ~jnp.all(jnp.isfinite(ts))
        fail_if(bad, "ts must be finite and strictly increasing")
        return ts
    if not _increasing(host):
        cast = ""
        if given is not None and _increasing(given):
            cast = (
                f": ts, given in {given.dtype}, is computed in {host.dtype} (the dtype of "
                "the model and inputs together), which merges some of its times; cast the "
                "model and inputs to a wider dtype, or shift ts towards 0"
            )
        raise ValueError(f"ts must be finite and strictly increasing, got {host}{cast}")
    return ts


def _check_solver(solver: diffrax.AbstractSolver) -> None:
    """A `ValueError` naming `solver` if it needs more than one term (IMEX or SDE
    solvers, `SemiImplicitEuler`): the latent ODE is one `ODETerm`."""
    structure = solver.term_structure
    multi = diffrax.MultiTerm in (structure, typing.get_origin(structure))
    if isinstance(structure, tuple) or multi:
        raise ValueError(
            f"solver={type(solver).__name__}() needs several terms (an IMEX, SDE or split "
            "solver), but the latent ODE is one diffrax.ODETerm: pass an ODE solver, e.g. "
            "diffrax.Tsit5(), or diffrax.Kvaerno5() (implicit; see unroll_continuous's "
            "solver argument for its tolerances in float32)"
        )


def _check_dt0(dt0: object) -> float | Array | None:
    """`dt0` as a `float`, checked, or a traced scalar (e.g. under `vmap` over step
    sizes), checked at run time."""
    if isinstance(dt0, jax.core.Tracer) and dt0.shape != ():
        raise ValueError(
            f"dt0 must be a positive, finite real number, got a traced array of shape {dt0.shape}"
        )
    return None if dt0 is None else check_real_or_traced("dt0", dt0)


def _check_no_solve_options(**options: object) -> None:
    """A `ValueError` naming the diffrax options given (not `None`): `exact=True` solves
    no ODE, so they would be ignored."""
    given = [name for name, value in options.items() if value is not None]
    if given:
        verb, them = ("has", "it") if len(given) == 1 else ("have", "them")
        raise ValueError(
            f"{', '.join(given)} {verb} no effect with exact=True (the matrix exponential "
            f"solves no ODE): leave {them} None, or pass exact=False to integrate with diffrax"
        )


@jaxtyped(typechecker=beartype)
def unroll_continuous(
    model: KoopmanAutoencoder,
    x0: Float[Array | np.ndarray, " state_dim"],
    ts: Real[Array | np.ndarray, " times"],
    actions: Float[Array | np.ndarray, "intervals action_dim"] | None = None,
    *,
    reencode_dt: RealScalar | None = None,
    num_segments: IntLike | None = None,
    exact: bool = False,
    solver: diffrax.AbstractSolver | None = None,
    stepsize_controller: diffrax.AbstractStepSizeController | None = None,
    dt0: RealScalar | None = None,
    max_steps: IntLike | None = 4096,
    adjoint: diffrax.AbstractAdjoint | None = None,
    progress_meter: diffrax.AbstractProgressMeter | None = None,
    throw: bool = True,
) -> Float[Array, "times state_dim"]:
    """Predict the states at times `ts` by integrating the latent ODE (Fig. 1.2).

    `z(ts[0]) = phi(x0)`; `dz/dt = f(z)` (the generator `(delta/dt) K` of linear
    dynamics, or the MLP field; `f(z, omega(u_i))` on `[ts[i], ts[i + 1])` for a
    controlled model, whose control `u_i = actions[i]` is held between samples, zero-order
    hold, as the data were sampled) is solved with `diffrax.diffeqsolve` (adaptive, default
    `Tsit5` with `PIDController(rtol=1e-6, atol=1e-8)`; a solver without an error
    estimate, e.g. `diffrax.Euler()`, takes fixed steps, `ConstantStepSize()`, of `dt0`,
    by default the data's sampling interval `model.dynamics.dt`) between reencoding times
    `tau_j = ts[0] + j reencode_dt`, where `z <- phi(psi(z))`. States are decoded at
    `ts`; a time `t` equal to a reencoding time (up to the rounding of computed times
    such as `jnp.linspace`: 16 machine epsilons of the dtype `ts` was given in, or is
    promoted to if lower (a float16 / bfloat16 model's), relative to `max(|t|, |ts[0]|)`,
    plus 16 float32 units of `t - ts[0]` for a NumPy or JAX float32 `reencode_dt`; a
    Python number is exact, and a half-precision one an error) is decoded *before*
    reencoding, as in [`unroll`][lineax_seq.unroll], and the reencoding happens at that
    time. Where the times span a reencoding time and the last one's tolerance reaches
    half a `reencode_dt` (float32 times far from 0, or a float32 `reencode_dt` over very
    many intervals), the reencoding times cannot be placed: an error that names the way
    out.
    Differentiable (diffrax's adjoint, default recursive checkpointing), so models can be
    trained through it; with `diffrax.BacksolveAdjoint` not with respect to a traced `ts`
    (diffrax's limitation).
    Forward mode (`jax.jvp`, `jax.jacfwd`) needs `adjoint=diffrax.ForwardMode()`: the
    default adjoint is a `custom_vjp`. The paper's integrator (odeint's Dormand-Prince at
    `rtol = atol = 1.4e-8`) is `solver=diffrax.Dopri5()` with
    `PIDController(rtol=1.4e-8, atol=1.4e-8)`.

    The ODE is the model's continuous-time one whatever its `discretization`: its flow
    over `dt` is the `"exact"` step, while a `"bilinear"` model's `unroll` takes Tustin
    steps, which advance an oscillation of frequency `w` by `2 atan(w delta / 2)` per
    step rather than `w delta`; the two predictions of one bilinear model drift apart
    over long horizons (about 5 rad of phase over 1,000 Lorenz-scale steps).

    With `exact=True` (linear dynamics only) the flow is the matrix exponential
    `z(t) = exp((t - tau_j) (delta / dt) K) z(tau_j)`: the oracle for the ODE path. With concrete
    `ts` (outside `jit`, or closed over) one exponential is computed per distinct offset
    `t - tau_j` (about `k + 1` for a uniform grid reencoded every `k` points: offsets
    that differ by less than half a unit in the last place of `max |ts|` share one);
    with traced `ts`
    one per output time. Autonomous models only (`action_dim == 0`; for a controlled one
    on a uniform grid, [`unroll`][lineax_seq.unroll] of a model with
    `discretization="exact"` is the exact zero-order-hold flow).

    Controls: the field jumps at every `ts[i]`, and the solver steps onto those times
    (the adaptive controller is wrapped in `diffrax.ClipStepSizeController` with
    `jump_ts` at `ts`; a `ClipStepSizeController` given keeps its own `step_ts` and
    `jump_ts` and gains `ts`), so no step straddles a change of control. Each segment's
    solve takes the `jump_ts` inside it: a segment ends on its last time anyway. Fixed
    steps (`ConstantStepSize`, `StepTo`) cannot do this and are refused with `actions`.

    Compilation: with concrete `ts` the solve is compiled for the number of reencoding
    segments and the most output times in one segment (rounded up to a power of two);
    a grid that changes either compiles anew (about a second on a CPU). A new number of
    output times otherwise compiles only the small programs that pick and decode the
    states at `ts` (and, with controls, the solve). To solve many grids with one
    compilation, call it inside `jax.jit` with the grids traced and `num_segments` given
    (every segment then saves at all of
    `ts`).

    **Arguments:**

    - `model`: a [`KoopmanAutoencoder`][lineax_seq.KoopmanAutoencoder].
    - `x0`: initial state `(state_dim,)`, finite (a JAX or NumPy array).
    - `ts`: finite, strictly increasing output times `(times,)` (a JAX or NumPy
        array, floating or integer; integers are exact); `ts[0]` is the initial time.
        They are computed in the model's dtype.
    - `actions`: for a controlled model (`action_dim > 0`, else `None`), the finite
        controls `(times - 1, action_dim)`: `actions[i]` acts on `[ts[i], ts[i + 1])`.
    - `reencode_dt`: reencoding interval, a positive, finite Python, NumPy or (concrete)
        JAX real scalar (not a half-precision float), or `None` (never reencode).
    - `num_segments`: number of reencoding segments,
        `max(1, ceil((ts[-1] - ts[0]) / reencode_dt))`; required only if `ts` is traced (inside
        `jit`), where it cannot be computed from `ts` (too few is then a run-time
        error, more are empty segments); with concrete `ts` the count is computed (a
        time within the rounding tolerance past a reencoding time counts as on it) and
        a `num_segments` given must be at least that.
    - `exact`: use the matrix exponential instead of an ODE solver (a bool).
    - `solver` (any solver of one `ODETerm`; not the IMEX, SDE or split ones, which need
        several terms; in float32 an implicit solver's default root finder,
        `diffrax.VeryChord` at the controller's tolerances, can judge its iterations
        divergent at rounding level and reject steps until `max_steps`: give it e.g.
        `root_finder=optimistix.Chord(rtol=1e-5, atol=1e-6)`),
        `stepsize_controller`, `dt0` (positive; a traced scalar too, e.g.
        under `vmap` over step sizes), `max_steps` (positive, or `None`: unbounded, not
        differentiable with diffrax's default adjoint; per segment, in which every
        interval between output times takes at least one step with controls),
        `adjoint`, `progress_meter`: passed to `diffrax.diffeqsolve` (e.g.
        `progress_meter=diffrax.TqdmProgressMeter()` for long solves; each reencoding
        segment is one solve, so it shows one bar per segment). `StepTo` only without
        reencoding (one segment).
    - `throw`: whether a failed solve (e.g. `max_steps` reached) raises an error (at run
        time under `jit`, on a mesh too: a `jax.errors.JaxRuntimeError` with the
        message; the backward solve of `diffrax.BacksolveAdjoint` is checked by diffrax
        itself, with a callback on one device, which on a mesh aborts the process). With
        `throw=False` it raises none: the states from the failure on are NaN, so that
        one bad initial condition under `vmap` does not stop the others.
        With `exact=True` (no ODE solve) the solver options must be left `None`
        (`max_steps` and `throw` are unused).

    **Returns:**

    The decoded states at `ts`, shape `(times, state_dim)`, in the dtype of the model and
    inputs together. A float16 / bfloat16 model with half-precision times is integrated in
    float32.
    """
    check_instance("model", model, KoopmanAutoencoder)
    reencode_dt, reencode_eps = _check_reencode_dt(reencode_dt)
    num_segments = check_optional_int("num_segments", num_segments)
    exact = check_bool("exact", exact)
    throw = check_bool("throw", throw)
    dt0 = _check_dt0(dt0)
    max_steps = check_optional_int("max_steps", max_steps)
    _diffeq.check_solve_options(solver, stepsize_controller, adjoint)
    check_option("progress_meter", progress_meter, diffrax.AbstractProgressMeter)
    if solver is not None:
        _check_solver(solver)
    if exact and not isinstance(model.dynamics, LinearKoopmanDynamics):
        raise ValueError("exact=True needs linear (Koopman) latent dynamics")
    if exact and model.action_dim:
        raise ValueError(
            f"exact=True is for autonomous models; this one has action_dim="
            f"{model.action_dim}: integrate with exact=False, or unroll a model with "
            "discretization='exact' (the exact zero-order-hold flow on a uniform grid)"
        )
    if model.action_dim and isinstance(
        stepsize_controller, diffrax.ConstantStepSize | diffrax.StepTo
    ):
        raise ValueError(
            f"stepsize_controller={type(stepsize_controller).__name__}() cannot be used with "
            "actions (fixed steps cannot stop at every change of control): use an adaptive "
            "solver and controller, e.g. the default Tsit5 with a PIDController"
        )
    if exact:
        _check_no_solve_options(
            solver=solver,
            stepsize_controller=stepsize_controller,
            dt0=dt0,
            adjoint=adjoint,
            progress_meter=progress_meter,
        )
    if np.ndim(ts) != 1:
        raise ValueError(f"ts must have shape (times,), got ts.shape={np.shape(ts)}")
    # The host copy comes from the argument itself: inside `jit` even a closed-over NumPy
    # grid becomes a tracer once converted or cast.
    ts_host = _concrete(ts)
    given_dtype = _given_dtype(ts)
    actions = None if actions is None else jnp.asarray(actions)
    actions = _check_actions(model, actions, np.shape(ts)[0] - 1, "len(ts) - 1")
    x0 = _diffeq.check_x0(jnp.asarray(x0), model.state_dim, "the model")
    # Integer times are exact: they take the states' dtype (no int-float promotion).
    ts = jnp.asarray(ts) if given_dtype is not None else jnp.asarray(ts).astype(x0.dtype)
    x0, ts, actions = promote(model, x0, ts, actions)
    out_dtype = ts.dtype
    # Times are known to the dtype they were given in, or are promoted to if coarser
    # (a half-precision model's), whatever they are then computed in.
    rounding_dtype = max((d for d in (given_dtype, ts.dtype) if d is not None), key=_eps)
    solve_dtype = jnp.dtype(work_dtype(ts.dtype))  # float32 for half precision
    if solve_dtype != ts.dtype:
        # A half-precision model (float16 / bfloat16 throughout) is integrated in float32,
        # its decoded states cast back.
        single = lambda a: a.astype(solve_dtype) if eqx.is_inexact_array(a) else a
        if ts_host is not None:  # kept on the host: concrete below, under jit too
            ts_host = ts_host.astype(ts.dtype).astype(solve_dtype)
        model, x0, ts = jax.tree.map(single, model), x0.astype(solve_dtype), ts.astype(solve_dtype)
        actions = None if actions is None else actions.astype(solve_dtype)
    grid = _continuous_grid(ts, ts_host, rounding_dtype, reencode_dt, reencode_eps, num_segments)
    reencode = reencode_dt is not None
    if exact:
        states = _exact_path(model, x0, grid, reencode)
    else:
        solver, controller, dt0 = _solve_options(model, grid, solver, stepsize_controller, dt0)
        if actions is not None and not isinstance(
            controller, diffrax.AbstractAdaptiveStepSizeController
        ):
            raise ValueError(
                f"{type(solver).__name__}() has no error estimate, so it takes fixed steps, "
                "which cannot stop at every change of control: use an adaptive solver (e.g. "
                "the default Tsit5) with actions"
            )
        options = (solver, controller, dt0, max_steps, adjoint, progress_meter, throw)
        states = _ode_path(model, x0, grid, reencode, actions, *options)
    return states.astype(out_dtype)


class _HostGrid(NamedTuple):
    """`ts`, `taus` and `seg` of a `_Grid` as NumPy arrays."""

    ts: np.ndarray
    taus: np.ndarray
    seg: np.ndarray


class _Grid(NamedTuple):
    """`unroll_continuous`'s output times and reencoding segments, in the working dtype;
    `host` holds their NumPy values when the times are concrete, else `None`."""

    ts: Array  # output times `(times,)`
    taus: Array  # reencoding times `(num + 1,)`: segment `j` is `(taus[j], taus[j + 1]]`
    seg: Array  # the segment of every output time `(times,)`
    num: int  # number of segments
    host: _HostGrid | None


def _continuous_grid(
    ts: Array,
    ts_host: np.ndarray | None,
    rounding_dtype: np.dtype,
    reencode_dt: float | None,
    reencode_eps: float,
    num_segments: int | None,
) -> _Grid:
    """Check the times `ts` (working dtype; `ts_host` their concrete values, if known, and
    `rounding_dtype` the precision they are known to) and place the reencoding segments."""
    given, ts_host = ts_host, None if ts_host is None else ts_host.astype(ts.dtype)
    ts = _check_ts(ts, ts_host, given)
    tolerance = None
    if reencode_dt is not None:
        tolerance = _tolerance(
            ts if ts_host is None else ts_host, rounding_dtype, reencode_dt, reencode_eps
        )
    ts, num = _segments(ts, ts_host, reencode_dt, tolerance, num_segments)
    if ts_host is None:
        taus, seg = _reencoding_grid(ts, reencode_dt, num, tolerance)
        return _Grid(ts, taus, seg, num, None)
    host_taus, host_seg = _reencoding_grid(ts_host.astype(np.float64), reencode_dt, num, tolerance)
    taus, seg = jnp.asarray(host_taus, ts.dtype), jnp.asarray(host_seg)
    return _Grid(ts, taus, seg, num, _HostGrid(ts_host, host_taus, host_seg))


def _exact_path(model: KoopmanAutoencoder, x0: Array, grid: _Grid, reencode: bool) -> Array:
    """`unroll_continuous(exact=True)`: the matrix-exponential flow on `grid`."""
    host = grid.host
    if host is None:
        # One exponential per output time and per segment.
        offsets, index = grid.ts - grid.taus[grid.seg], None
        steps, jump_index = grid.taus[1:] - grid.taus[:-1], jnp.arange(grid.num)
    else:
        # One per distinct offset: ~k + 1 on a uniform grid reencoded every k points.
        # Offsets closer than half a unit in the last place of max |ts| (in ts's
        # dtype) share one: below the resolution of the largest times.
        finfo = np.finfo(host.ts.dtype)
        resolution = max(float(np.max(np.abs(host.ts))) * float(finfo.eps) / 2, finfo.tiny)
        offsets, index = _distinct(host.ts - host.taus[host.seg], resolution)
        steps, jump_index = _distinct(np.diff(host.taus), resolution)
        offsets, steps = jnp.asarray(offsets, grid.ts.dtype), jnp.asarray(steps, grid.ts.dtype)
    return _exact_flow(model, x0, steps, jump_index, offsets, index, grid.seg, reencode)


def _solve_options(
    model: KoopmanAutoencoder,
    grid: _Grid,
    solver: diffrax.AbstractSolver | None,
    stepsize_controller: diffrax.AbstractStepSizeController | None,
    dt0: float | Array | None,
) -> tuple[diffrax.AbstractSolver, diffrax.AbstractStepSizeController, Array | None]:
    """The solver, step-size controller and `dt0` that `unroll_continuous` solves with."""
    if isinstance(stepsize_controller, diffrax.StepTo) and grid.num > 1:
        raise ValueError(
            f"stepsize_controller=StepTo(...) cannot be used with reencoding (each of the "
            f"{grid.num} segments is solved on its own, from its own t0 to its own t1): use "
            "diffrax.ConstantStepSize() and dt0"
        )
    solver = diffrax.Tsit5() if solver is None else solver
    if stepsize_controller is None:
        # Without an error estimate (e.g. Euler): fixed steps.
        stepsize_controller = _diffeq.default_controller(
            solver, 1e-6, 1e-8, diffrax.ConstantStepSize()
        )
    if isinstance(stepsize_controller, diffrax.ConstantStepSize) and dt0 is None:
        # The data's sampling interval: Euler steps of MLP dynamics are then the steps
        # of the discrete unroll.
        dt0 = model.dynamics.dt
    if dt0 is not None:
        # In the dtype of the times, as diffrax needs; an array, so that `_solve` traces it
        # (a new value, e.g. in a convergence study, compiles nothing new).
        dt0 = jnp.asarray(dt0, grid.ts.dtype)
    return solver, stepsize_controller, dt0


def _ode_path(model, x0, grid: _Grid, reencode: bool, actions, *options) -> Array:
    """`unroll_continuous` through `diffrax.diffeqsolve` on `grid`, one solve a segment,
    with `actions` (or `None`) held between the output times; `options` as `_solve`
    takes them."""
    if grid.host is None:
        # Every segment saves at all of ts (shapes cannot depend on ts).
        save_ts = jnp.broadcast_to(grid.ts, (grid.num, grid.ts.shape[0]))
        position = jnp.arange(grid.ts.shape[0])
    else:
        # Each segment saves only at its own times (padded), then at its end.
        save_ts, host_position = _segment_times(grid.host.taus, grid.host.seg, grid.host.ts)
        save_ts = jnp.asarray(save_ts, grid.ts.dtype)
        position = jnp.asarray(host_position)
    # The times only with controls (which change with their number anyway): a new number
    # of times then compiles no new solve.
    ts = None if actions is None else grid.ts
    zs = _solve(model, x0, grid.taus, save_ts, reencode, ts, actions, *options)
    # Apart from the solve: its compilation then depends on the shape of `save_ts` only.
    return _decode_at(model, zs, grid.seg, position)


@eqx.filter_jit
def _decode_at(model, zs, seg, position) -> Array:
    """The decoded states at `ts[i]`, which is `save_ts[seg[i], position[i]]`."""
    return jax.vmap(model.decode)(zs[seg, position])


@eqx.filter_jit
def _exact_flow(model, x0, steps, jump_index, offsets, index, seg, reencode: bool) -> Array:
    """`unroll_continuous(exact=True)` from its grid: `steps` between reencoding times
    (`steps[jump_index]` in order), the distinct `offsets` of the output times from the
    start of their segment `seg` (`offsets[index]` in order; `index=None`: one each)."""
    generator = model.dynamics.generator().astype(offsets.dtype)  # a half model's: float32
    flow = jax.vmap(lambda s: jsl.expm(s * generator))

    def advance(z, jump):
        z_end = matmul(jump, z)
        z_next = model.reencode(z_end) if reencode else z_end
        return z_next, z

    # One batch of exponentials for the jumps and the offsets: two large ones in one
    # program deadlocked XLA:CPU (jaxlib 0.10.2, 2 cores, ~1,000 of each).
    exponentials = flow(jnp.concatenate([steps, offsets]))
    jumps, flows = exponentials[: steps.shape[0]], exponentials[steps.shape[0] :]
    _, starts = jax.lax.scan(advance, model.encode(x0), jumps[jump_index])
    # z(ts[i]) = exp(offset_i K) z(tau_seg[i]); a linear decoder is folded into the
    # flows, psi(z(ts[i])) = (W exp(offset_i K)) z(tau_seg[i]) + b.
    fused = isinstance(model.decoder, UnitNormLinear)
    if fused:
        flows = jnp.einsum(
            "dn,unm->udm", model.decoder.normalized_weight(), flows, precision=_HIGHEST
        )
    per_time = lambda flows: jnp.einsum("tij,tj->ti", flows, starts[seg], precision=_HIGHEST)
    if index is None:
        out = per_time(flows)
    elif flows.shape[0] * starts.shape[0] <= index.shape[0] * starts.shape[1]:
        # Few distinct offsets (a regular grid): every offset's flow of every start.
        out = jnp.einsum("uij,sj->usi", flows, starts, precision=_HIGHEST)[index, seg]
    else:  # irregular times: the (offsets, starts) table would outgrow one flow per time
        out = per_time(flows[index])
    return out + model.decoder.bias if fused else jax.vmap(model.decode)(out)


def _segment_controller(
    controller: diffrax.AbstractStepSizeController,
    start: Array,
    jumps: Array | None,
    t0: Array,
    t1: Array,
) -> diffrax.AbstractStepSizeController:
    """`controller` for the segment `(t0, t1)` solved in the time `t - start` (`t0`, `t1`
    shifted already): a `ClipStepSizeController`'s own `step_ts` and `jump_ts` shifted by
    `start` (its jumps outside the segment dropped, see `_inner_jumps`), and the controls'
    `jumps` (shifted and dropped already; `None` without controls) added to its
    `jump_ts`, or to those of a `ClipStepSizeController` wrapped around an adaptive
    controller."""
    if isinstance(controller, diffrax.ClipStepSizeController):
        shift = lambda ts: None if ts is None else ts.astype(start.dtype) - start
        step_ts, jump_ts = shift(controller.step_ts), shift(controller.jump_ts)
        if jump_ts is not None:
            jump_ts = _inner_jumps(jump_ts, t0, t1)
        if jumps is not None:
            jump_ts = jumps if jump_ts is None else jnp.concatenate([jump_ts, jumps])
        return diffrax.ClipStepSizeController(
            controller.controller,
            step_ts=step_ts,
            jump_ts=jump_ts,
            store_rejected_steps=controller.store_rejected_steps,
            _callback_on_reject=controller.callback_on_reject,
        )
    if jumps is not None and isinstance(controller, diffrax.AbstractAdaptiveStepSizeController):
        return diffrax.ClipStepSizeController(controller, jump_ts=jumps)
    return controller


def _inner_jumps(jumps: Array, t0: Array, t1: Array) -> Array:
    """The sorted times `jumps` with those not inside `(t0, t1)`, to a few units of
    rounding, moved to -inf (before) or +inf (after): still sorted, and a field that
    looks its control up in them reads the same one between `t0` and `t1`. diffrax (0.7)
    steps to just before a jump and restarts just after it, so a jump at `t1` ended the
    solve past `t1` without its save there (left at inf; the solve reported success)."""
    edge = _ULPS * _eps(jumps.dtype) * jnp.maximum(jnp.abs(t0), jnp.abs(t1))
    inf = jnp.asarray(jnp.inf, jumps.dtype)
    return jnp.where(jumps <= t0 + edge, -inf, jnp.where(jumps >= t1 - edge, inf, jumps))


def _controlled_field(t, z, args):
    """`dz/dt` of a controlled model, `args = (dynamics, vs, ts)`: the encoded control
    `vs[i]` on `[ts[i], ts[i + 1])`. Right-continuous at `ts[i]`, where the solver stops
    (`jump_ts`): a step ends just before it and the next one starts just after it."""
    dynamics, vs, ts = args
    i = jnp.clip(jnp.searchsorted(ts, t, side="right") - 1, 0, vs.shape[0] - 1)
    return dynamics.vector_field(z, vs[i])


@eqx.filter_jit
def _solve(
    model,
    x0,
    taus,
    save_ts,
    reencode: bool,
    ts,
    actions,
    solver,
    stepsize_controller,
    dt0,
    max_steps,
    adjoint,
    progress_meter,
    throw: bool,
) -> Array:
    """`unroll_continuous`'s ODE path from its grid: segment `j` is solved from
    `taus[j]` to `taus[j + 1]`; returns the latents at `save_ts[j]`, `(num, saves,
    latent_dim)`. `actions[i]` (if not `None`) is held on `[ts[i], ts[i + 1])`."""
    # The dynamics (and controls) go in as `args`, not closed over, so every adjoint
    # (backsolve too) sees them as inputs to differentiate.
    if actions is None:
        term, vs = diffrax.ODETerm(lambda t, z, dynamics: dynamics.vector_field(z)), None
    else:
        term, vs = diffrax.ODETerm(_controlled_field), jax.vmap(model.encode_action)(actions)
        if vs.shape[0] == 0:  # one output time: no interval, a control the field can read
            vs = jnp.zeros((1, model.dynamics.action_latent_dim), vs.dtype)
    if progress_meter is None:  # diffeqsolve's default
        progress_meter = diffrax.NoProgressMeter()
    # The field depends on time only through the controls, so each segment is solved on
    # `[0, t1 - t0]`, the controller's own times shifted alike: float32 times far from 0
    # (1e4 + ...) leave no room for the solver's steps. Not StepTo's times, which are
    # whole (one segment).
    relative = not isinstance(stepsize_controller, diffrax.StepTo)
    constant_dt0 = dt0 if isinstance(stepsize_controller, diffrax.ConstantStepSize) else None

    def segment(z, inputs):
        t0, t1, saves = inputs
        # Every time lies in its segment; clipped here, against the very t0 and t1
        # diffrax gets, as outside the scan XLA may recompute `taus` with a different
        # rounding (saves then fall outside by that rounding).
        saves = jnp.clip(saves, t0, t1)
        start = t0 if relative else jnp.zeros_like(t0)
        step = dt0
        if constant_dt0 is not None:
            # Fixed steps take ceil((t1 - t0) / dt0) of them: a segment that dt0 divides
            # up to rounding (0.2 / 0.05 = 4.000000000000001) gets exactly that many.
            ratio = (t1 - t0) / constant_dt0
            n = jnp.maximum(jnp.round(ratio), 1)
            close = jnp.abs(ratio - n) <= 64 * jnp.finfo(ratio.dtype).eps * n
            step = jnp.where(close, (t1 - t0) / n, constant_dt0)
        # The solver steps onto every change of control inside the segment (see
        # `_controlled_field`).
        jumps = None if vs is None else _inner_jumps(ts - start, t0 - start, t1 - start)
        controller = _segment_controller(stepsize_controller, start, jumps, t0 - start, t1 - start)
        args = model.dynamics if vs is None else (model.dynamics, vs, jumps)
        sol = diffrax.diffeqsolve(
            term,
            solver,
            t0=t0 - start,
            t1=t1 - start,
            dt0=step,
            y0=z,
            args=args,
            # The last save time is t1 itself, so zs[-1] is the segment's end.
            saveat=diffrax.SaveAt(ts=saves - start),
            stepsize_controller=controller,
            max_steps=max_steps,
            # The forward solve is checked below, mesh-safe (diffrax's check is an
            # `eqx.error_if`); a backsolve's backward solve only diffrax can check.
            throw=throw and isinstance(adjoint, diffrax.BacksolveAdjoint),
            adjoint=_diffeq.solve_adjoint(adjoint),
            progress_meter=progress_meter,
        )
        zs = cast(Array, sol.ys)
        z_end = zs[-1]
        z_next = model.reencode(z_end) if reencode else z_end
        if throw:
            maxed = sol.result == diffrax.RESULTS.max_steps_reached
            fail_if(maxed, f"the ODE solve reached max_steps={max_steps} in a segment; {_OR}")
            failed = (sol.result != diffrax.RESULTS.successful) & ~maxed
            fail_if(failed, f"the ODE solve failed (e.g. dt_min reached, or non-finite); {_OR}")
        else:
            # A failed solve leaves its unreached states inf, which ReLU layers can map
            # back to finite values (relu(-inf) = 0): NaN from the failure on.
            ok = sol.result == diffrax.RESULTS.successful
            zs = jnp.where(ok | jnp.isfinite(zs), zs, jnp.nan)
            z_next = jnp.where(ok, z_next, jnp.nan)
        return z_next, zs

    _, zs = jax.lax.scan(segment, model.encode(x0), (taus[:-1], taus[1:], save_ts))
    return zs
