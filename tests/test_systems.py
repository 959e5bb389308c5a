"""Dynamical systems: samplers, simulation accuracy against closed forms and invariants."""

import math
from typing import ClassVar

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from _compiles import compilations
from _devices import assert_check_fails

import lineax_seq as ls


class Ramp(ls.DynamicalSystem):
    """`x' = t + u`, time-dependent: `x(t) = t^2 / 2 + int_0^t u`."""

    state_dim: ClassVar[int] = 1
    action_dim: ClassVar[int] = 1
    dt: float = 0.1

    def vector_field(self, t, x, args):
        return jnp.stack([t + args[0]])

    def sample_initial(self, key, num):
        return jnp.zeros((num, 1))


@pytest.fixture(scope="module")
def lv_trajectories():
    system = ls.LotkaVolterra()
    return system, ls.sample_trajectories(system, jr.key(3), 4, 1000)[0]


def test_samplers_follow_the_paper(key):
    x = ls.ParabolicAttractor().sample_initial(key, 500)
    assert x.shape == (500, 2) and jnp.all(jnp.abs(x) <= 1.0)
    x = ls.Duffing().sample_initial(key, 500)
    assert jnp.all(jnp.abs(x[:, 0]) <= 2.0) and jnp.all(jnp.abs(x[:, 1]) <= 1.0)
    assert jnp.max(jnp.abs(x[:, 0])) > 1.5
    x = ls.LotkaVolterra().sample_initial(key, 500)
    assert jnp.all((x >= 0.02) & (x <= 3.0))
    x = ls.Pendulum().sample_initial(key, 500)
    assert jnp.all(jnp.abs(x[:, 0] - math.pi) <= math.radians(10.0) + 1e-6)
    assert jnp.all(x[:, 1] == 0)
    x = ls.Pendulum(release_deg=0.0, max_offset_deg=5.0).sample_initial(key, 500)
    assert jnp.all(jnp.abs(x[:, 0]) <= math.radians(5.0) + 1e-6)
    assert jnp.max(jnp.abs(x[:, 0])) > math.radians(4.5)
    x = ls.Lorenz63().sample_initial(key, 2000)
    assert jnp.allclose(jnp.mean(x, axis=0), jnp.array([0.0, 1.0, 1.05]), atol=0.1)
    assert jnp.allclose(jnp.std(x, axis=0), 1.0, atol=0.1)  # + N(0, 1) per coordinate
    system = ls.ControlledPendulum(max_torque=1.5)
    x = system.sample_initial(key, 500)  # theta ~ U[-pi, pi], omega ~ U[-1, 1]
    assert jnp.all(jnp.abs(x[:, 0]) <= math.pi) and jnp.all(jnp.abs(x[:, 1]) <= 1.0)
    assert jnp.min(x[:, 0]) < -0.9 * math.pi and jnp.max(x[:, 0]) > 0.9 * math.pi
    u = system.sample_actions(key, 50, 10)  # U[-max_torque, max_torque]
    assert jnp.all(jnp.abs(u) <= 1.5) and jnp.min(u) < -1.35 and jnp.max(u) > 1.35
    assert ls.Lorenz63().dt == 0.02 and ls.Duffing().dt == 0.01


def test_vector_fields_at_a_point():
    """Each field at one state, with parameters all different from one another (at the
    defaults, e.g. the four Lotka-Volterra rates are equal), against its formula."""
    cases = [
        (ls.ParabolicAttractor(mu=-0.3, lam=-2.0), [0.5, 1.0], None, [-0.15, -1.5]),
        (ls.Duffing(), [2.0, 0.5], None, [0.5, 2.0 - 8.0]),
        (
            ls.LotkaVolterra(alpha=1.0, beta=2.0, gamma=3.0, delta=4.0),
            [1.0, 2.0],
            None,
            [-3.0, 2.0],
        ),
        (ls.Lorenz63(sigma=2.0, rho=5.0, beta=0.5), [1.0, 2.0, 3.0], None, [2.0, 0.0, 0.5]),
        (ls.Pendulum(g=2.0, length=0.5), [math.pi / 2, 0.3], None, [0.3, -4.0]),
        (
            ls.ControlledPendulum(g=2.0, length=0.5, damping=0.5),
            [math.pi / 2, 2.0],
            [0.3],
            [2.0, -4.0 - 1.0 + 0.3],
        ),
    ]
    for system, x, u, want in cases:
        args = None if u is None else jnp.array(u)
        got = system.vector_field(0.0, jnp.array(x), args)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=type(system).__name__)


def test_parabolic_attractor_matches_closed_form():
    # Koopman embedding (x1, x2, x1^2) evolves linearly: x1 = a e^{mu t},
    # x2 = e^{lam t} (b - c a^2) + c a^2 e^{2 mu t} with c = lam / (lam - 2 mu).
    system = ls.ParabolicAttractor()
    a, b = 0.8, -0.5
    xs = ls.simulate(system, jnp.array([a, b]), 300)
    t = system.dt * jnp.arange(301, dtype=jnp.float32)
    mu, lam = system.mu, system.lam
    c = lam / (lam - 2 * mu)
    x1 = a * jnp.exp(mu * t)
    x2 = jnp.exp(lam * t) * (b - c * a**2) + c * a**2 * jnp.exp(2 * mu * t)
    assert xs.shape == (301, 2)
    assert jnp.allclose(xs[:, 0], x1, atol=1e-5) and jnp.allclose(xs[:, 1], x2, atol=1e-5)


def test_lotka_volterra_invariant_conserved(lv_trajectories):
    system, xs = lv_trajectories
    v = system.invariant(xs)
    assert xs.shape == (4, 1001, 2)
    assert jnp.max(jnp.abs(v - v[:, :1])) < 1e-5 * jnp.max(jnp.abs(v))


def test_pendulum_energy_conserved_and_swings():
    system = ls.Pendulum()
    xs, actions = ls.sample_trajectories(system, jr.key(5), 3, 1000)
    assert actions is None
    energy = system.energy(xs)
    assert jnp.max(jnp.abs(energy - energy[:, :1])) < 1e-5 * system.g
    # Released near the top, the pole swings through the bottom (theta = 0 side).
    assert jnp.min(xs[:, :, 0]) < 0.0


def test_controlled_pendulum_uses_the_torque(key):
    system = ls.ControlledPendulum()
    x0 = jnp.array([0.0, 0.0])
    rest = ls.simulate(system, x0, 50, actions=jnp.zeros((50, 1)))
    pushed = ls.simulate(system, x0, 50, actions=jnp.ones((50, 1)))
    assert jnp.allclose(rest, 0.0, atol=1e-6)
    # Small angles: theta'' ~ u, so theta(t) ~ t^2 / 2 early on.
    assert jnp.allclose(pushed[10, 0], 0.5 * (10 * system.dt) ** 2, rtol=0.02)
    # NumPy integers are counts too (they were traced, as jit arguments).
    xs, us = ls.sample_trajectories(system, key, np.int64(2), np.int64(20))
    assert xs.shape == (2, 21, 2) and us.shape == (2, 20, 1)


def test_controlled_intervals_keep_the_time():
    """Interval `i` is integrated over `[i dt, (i + 1) dt]` (time restarted at 0 in every
    interval), with adaptive and with fixed-step solvers."""
    us = jnp.linspace(-1.0, 1.0, 10)[:, None]
    t = 0.1 * jnp.arange(11.0)
    zero = jnp.zeros(1)
    xs = ls.simulate(Ramp(), zero, 10, actions=us)
    assert jnp.allclose(xs[:, 0], t**2 / 2 + jnp.concatenate([zero, jnp.cumsum(0.1 * us[:, 0])]))
    # Euler has no error estimate: one fixed step per interval, x_{i+1} = x_i + dt (t_i + u_i).
    euler = ls.simulate(Ramp(), zero, 10, actions=us, solver=diffrax.Euler())
    expected = jnp.concatenate([zero, jnp.cumsum(0.1 * (t[:-1] + us[:, 0]))])
    assert jnp.allclose(euler[:, 0], expected, atol=1e-6)


def test_sample_trajectories_names_a_missing_action_sampler(key):
    """A controlled system without `sample_actions` is named up front (it was an
    `AttributeError` from inside the jitted sampler)."""
    with pytest.raises(TypeError, match=r"Ramp has action_dim=1 but no sample_actions"):
        ls.sample_trajectories(Ramp(), key, 2, 3)


def test_fixed_step_solver_steps_on_the_sampling_times():
    system, x = ls.Duffing(), jnp.array([0.5, 0.2])
    expected = [x]
    for _ in range(5):
        expected.append(expected[-1] + system.dt * system.vector_field(0.0, expected[-1], None))
    xs = ls.simulate(system, x, 5, solver=diffrax.Euler())
    assert jnp.allclose(xs, jnp.stack(expected), atol=1e-6)
    # Finer fixed steps on request: 4 Euler steps per sampling interval.
    fine = [x]
    for _ in range(20):
        fine.append(fine[-1] + system.dt / 4 * system.vector_field(0.0, fine[-1], None))
    xs = ls.simulate(
        system, x, 5, solver=diffrax.Euler(), stepsize_controller=diffrax.ConstantStepSize(),
        dt0=system.dt / 4,
    )  # fmt: skip
    assert jnp.allclose(xs, jnp.stack(fine[::4]), atol=1e-6)


def test_simulate_bad_inputs():
    with pytest.raises(ValueError, match="x0 has shape"):
        ls.simulate(ls.Duffing(), jnp.zeros(3), 10)
    with pytest.raises(ValueError, match="actions must be given"):
        ls.simulate(ls.Duffing(), jnp.zeros(2), 10, actions=jnp.zeros((10, 1)))
    with pytest.raises(ValueError, match="actions has shape"):
        ls.simulate(ls.ControlledPendulum(), jnp.zeros(2), 10, actions=jnp.zeros((9, 1)))
    with pytest.raises(ValueError, match="name must be one of .* got name='nope'"):
        ls.get_system("nope")
    for dt in (0.0, -0.1, float("inf"), True):
        with pytest.raises(
            ValueError, match=f"dt must be a positive, finite real number, got dt={dt!r}$"
        ):
            ls.simulate(ls.Duffing(), jnp.zeros(2), 10, dt=dt)
    with pytest.raises(ValueError, match="x0 contains NaN"):
        ls.simulate(ls.Duffing(), jnp.array([0.0, jnp.nan]), 10)
    with pytest.raises(ValueError, match="steps=0"):
        ls.simulate(ls.Duffing(), jnp.zeros(2), 0)
    with pytest.raises(ValueError, match="got dt0=-0.1"):
        ls.simulate(ls.Duffing(), jnp.zeros(2), 10, dt0=-0.1)
    with pytest.raises(ValueError, match="dt0=0.01 has no effect with StepTo"):
        ls.simulate(ls.Duffing(), jnp.zeros(2), 10, solver=diffrax.Euler(), dt0=0.01)
    with pytest.raises(ValueError, match=r"StepTo\(...\) cannot be used with actions"):
        ls.simulate(
            ls.ControlledPendulum(), jnp.zeros(2), 3, actions=jnp.zeros((3, 1)),
            solver=diffrax.Euler(), stepsize_controller=diffrax.StepTo(jnp.arange(4.0)),
        )  # fmt: skip
    with pytest.raises(ValueError, match="num must be a positive integer, got num=0"):
        ls.sample_trajectories(ls.Duffing(), jr.key(0), 0, 10)
    with pytest.raises(ValueError, match=r"got num=np.int64\(0\)"):
        ls.sample_trajectories(ls.Duffing(), jr.key(0), np.int64(0), 10)
    nan_actions = jnp.zeros((10, 1)).at[3, 0].set(jnp.nan)
    with pytest.raises(ValueError, match=r"actions contains NaN .*actions\[3, 0\] = nan"):
        ls.simulate(ls.ControlledPendulum(), jnp.zeros(2), 10, actions=nan_actions)
    for tolerance in ("rtol", "atol"):
        with pytest.raises(
            ValueError,
            match=f"{tolerance} must be a finite, non-negative real number, got {tolerance}=-1.0",
        ):
            ls.simulate(ls.Duffing(), jnp.zeros(2), 10, **{tolerance: -1.0})
    with pytest.raises(ValueError, match="max_steps must be a positive integer, got max_steps=0"):
        ls.simulate(ls.Duffing(), jnp.zeros(2), 10, max_steps=0)
    # Tolerances only where the default PID controller runs (else silently ignored).
    pid = diffrax.PIDController(rtol=1e-3, atol=1e-6)
    with pytest.raises(ValueError, match="^rtol set the default PIDController's tolerances"):
        ls.simulate(ls.Duffing(), jnp.zeros(2), 10, rtol=1e-10, stepsize_controller=pid)
    with pytest.raises(ValueError, match="^rtol and atol set the default PIDController"):
        ls.simulate(ls.Duffing(), jnp.zeros(2), 10, rtol=1e-3, atol=1e-6, solver=diffrax.Euler())
    # The torque is `args` of shape (1,): a scalar, or two torques, are named errors.
    for args in (jnp.asarray(0.5), jnp.ones(2)):
        with pytest.raises(ValueError, match=rf"args is the torque u, .*{args.shape}"):
            ls.ControlledPendulum().vector_field(0.0, jnp.zeros(2), args)


@pytest.mark.parametrize("name", sorted(ls.SYSTEMS))
def test_vector_field_checks_the_state(name, no_jaxtyping):
    """A state of the wrong size is named (a shorter one was read with clamped indices,
    a longer or batched one broadcast silently); so is a non-array state, and a control
    given to an autonomous system. Static checks: they hold under `jit` and `vmap`."""
    system = ls.get_system(name)
    n, u = system.state_dim, jnp.zeros(system.action_dim) if system.action_dim else None
    field = lambda x: system.vector_field(0.0, x, u)
    for shape in ((n + 1,), (1,), (2, n), ()):
        for f in (field, jax.jit(field)):
            with pytest.raises(ValueError, match=rf"x must have shape \({n},\), got x.shape="):
                f(jnp.zeros(shape))
    with pytest.raises(TypeError, match="x must be a JAX or NumPy array, got x=None"):
        field(None)
    assert jax.vmap(field)(jnp.zeros((3, n))).shape == (3, n)
    assert field(np.zeros(n, np.float32)).shape == (n,)
    if not system.action_dim:
        with pytest.raises(ValueError, match=r"is autonomous: pass args=None, got args.shape"):
            system.vector_field(0.0, jnp.zeros(n), jnp.zeros(1))


def test_sample_trajectories_names_its_key(no_jaxtyping):
    """A missing key, an integer seed or a batch of keys is named before the jitted
    simulation (it failed inside it, by `jr.split`)."""
    bad = [(None, "key=None"), (0, "key=0"), (jr.split(jr.key(0)), r"an array of shape \(2,\)")]
    for key, got in bad:
        with pytest.raises(TypeError, match=f"key must be one JAX PRNG key, .*got {got}"):
            ls.sample_trajectories(ls.Duffing(), key, 2, 2)
    assert ls.sample_trajectories(ls.Duffing(), jr.PRNGKey(0), 2, 2)[0].shape == (2, 3, 2)


def test_systems_name_bad_arguments(no_jaxtyping):
    """A system given by name, a solver or controller given as a string, a seed for a
    key, and states of the wrong shape for an invariant are named (they failed deep
    inside, or, for the invariants, gave numbers for the wrong shape)."""
    with pytest.raises(TypeError, match=r"system must be a lineax_seq.DynamicalSystem, .*'duf"):
        ls.sample_trajectories("duffing", jr.key(0), 2, 2)
    with pytest.raises(TypeError, match=r"system must be a lineax_seq.DynamicalSystem"):
        ls.simulate("duffing", jnp.zeros(2), 2)
    for name, value, cls in [
        ("solver", "dopri5", "diffrax.AbstractSolver"),
        ("stepsize_controller", "pid", "diffrax.AbstractStepSizeController"),
        ("adjoint", "direct", "diffrax.AbstractAdjoint"),
    ]:
        with pytest.raises(TypeError, match=f"{name} must be None or an instance of {cls}, got"):
            ls.simulate(ls.Duffing(), jnp.zeros(2), 2, **{name: value})
    with pytest.raises(TypeError, match="key must be one JAX PRNG key, .*got key=0"):
        ls.Duffing().sample_initial(0, 2)
    with pytest.raises(TypeError, match="key must be one JAX PRNG key, .*got key=0"):
        ls.ControlledPendulum().sample_actions(0, 2, 3)
    xs = ls.simulate(ls.Pendulum(), jnp.array([3.0, 0.0]), 5)
    assert ls.Pendulum().energy(xs).shape == (6,)
    for bad in (xs.T, jnp.zeros(3)):
        with pytest.raises(ValueError, match=r"x must be states of shape \(\*batch, 2\) of Pend"):
            ls.Pendulum().energy(bad)
        with pytest.raises(ValueError, match=r"x must be states of shape \(\*batch, 2\) of Lotka"):
            ls.LotkaVolterra().invariant(bad)


def test_get_system_names_its_argument(no_jaxtyping):
    assert isinstance(ls.get_system("duffing"), ls.Duffing)
    with pytest.raises(TypeError, match=r"name must be a str, .*got name=\['duffing'\]"):
        ls.get_system(["duffing"])


def test_get_system_overrides_parameters(no_jaxtyping):
    pendulum = ls.get_system("pendulum", g=1.0, max_offset_deg=5.0)
    assert isinstance(pendulum, ls.Pendulum) and (pendulum.g, pendulum.max_offset_deg) == (1, 5)
    assert pendulum.length == ls.Pendulum().length  # the others keep the paper's values
    with pytest.raises(ValueError, match=r"gravity is not a parameter of the 'pendulum' system"):
        ls.get_system("pendulum", gravity=1.0)
    with pytest.raises(ValueError, match=r"a, b are not parameters .*\['dt'\]"):
        ls.get_system("duffing", a=1.0, b=2.0)
    with pytest.raises(ValueError, match="Pendulum.g must be a positive"):
        ls.get_system("pendulum", g=0.0)


def test_system_parameters_are_checked(key):
    """Parameters are checked at construction: finite, and positive (or >= 0) where
    the physics needs it; NumPy and JAX scalars are parameters too, and a system built
    under `vmap` or `jit` (traced parameters) works, its parameters checked at run time
    (a negative traced `dt` ran time backwards)."""
    bad = [
        (lambda: ls.Pendulum(length=0.0), "Pendulum.length must be a positive, finite"),
        (lambda: ls.ControlledPendulum(damping=-0.1), "damping must be a finite, non-negative"),
        (lambda: ls.LotkaVolterra(alpha=float("nan")), "got LotkaVolterra.alpha=nan"),
        (lambda: ls.ParabolicAttractor(mu=float("inf")), "ParabolicAttractor.mu must be a finite"),
        (lambda: ls.Lorenz63(sigma=True), "got Lorenz63.sigma=True"),
        (lambda: ls.Duffing(dt=0), "got Duffing.dt=0"),
        (lambda: ls.Pendulum(release_deg=float("inf")), "Pendulum.release_deg must be a finite"),
    ]
    for make, message in bad:
        with pytest.raises(ValueError, match=message):
            make()
    assert ls.ParabolicAttractor(mu=0.5).mu == 0.5 and ls.ControlledPendulum(damping=0).damping == 0
    x = jnp.array([1.0, 0.0])
    numpy = ls.simulate(ls.Pendulum(g=np.float32(4.0), length=2), x, 5)
    np.testing.assert_allclose(numpy, ls.simulate(ls.Pendulum(g=2.0), x, 5), rtol=1e-6)
    gs = jnp.array([2.0, 4.0])
    fields = jax.vmap(lambda g: ls.Pendulum(g=g).vector_field(0.0, x, None))(gs)
    np.testing.assert_allclose(fields[:, 1], -gs * jnp.sin(1.0), rtol=1e-6)
    with pytest.raises(ValueError, match="Pendulum.g must be a positive, finite"):
        jax.vmap(lambda g: ls.Pendulum(g=g).vector_field(0.0, x, None))(-gs)
    run = eqx.filter_jit(lambda dt: ls.simulate(ls.Pendulum(dt=dt), x, 3))
    np.testing.assert_allclose(
        run(jnp.asarray(0.1)), ls.simulate(ls.Pendulum(dt=0.1), x, 3), rtol=1e-5
    )
    for bad in (-0.1, math.nan):
        assert_check_fails("Pendulum.dt must be a positive, finite", run, jnp.asarray(bad))
    # Counts: a NumPy integer or 0 is a count, -1 is not.
    assert ls.Duffing().sample_initial(key, np.int64(3)).shape == (3, 2)
    assert ls.Lorenz63().sample_initial(key, 0).shape == (0, 3)
    with pytest.raises(ValueError, match="num must be an integer >= 0, got num=-1"):
        ls.Duffing().sample_initial(key, -1)
    with pytest.raises(ValueError, match="steps must be an integer >= 0, got steps=-2"):
        ls.ControlledPendulum().sample_actions(key, 2, -2)


def test_simulate_takes_numpy_inputs():
    """NumPy arrays, integers and scalars give the results of their JAX / Python
    counterparts."""
    system, x = ls.ControlledPendulum(), np.array([0.3, -0.1], np.float32)
    us = np.linspace(-1.0, 1.0, 5, dtype=np.float32)[:, None]
    got = ls.simulate(
        system, x, np.int64(5), actions=us, dt=np.float64(0.02), rtol=np.float32(1e-6)
    )
    expected = ls.simulate(system, jnp.asarray(x), 5, actions=jnp.asarray(us), dt=0.02, rtol=1e-6)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    # NumPy's default float64 actions with a float32 state compute in float64 (under x64)
    # instead of failing inside diffrax.
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        wide = ls.simulate(system, x, 5, actions=us.astype(np.float64), dt=0.02)
        assert wide.dtype == jnp.float64
        np.testing.assert_allclose(wide, expected, rtol=1e-5, atol=1e-6)
        # Likewise NumPy float64 parameters (e.g. a sweep over np.linspace), which make
        # the field float64: they failed inside diffrax, naming nothing.
        swept = ls.simulate(ls.ControlledPendulum(g=np.float64(9.81)), x, 5, actions=us, dt=0.02)
        assert swept.dtype == jnp.float64
        np.testing.assert_allclose(swept, expected, rtol=1e-5, atol=1e-6)
        # A NumPy float64 sampling interval does not widen the state (the scan refused).
        spaced = ls.simulate(ls.ControlledPendulum(dt=np.float64(0.02)), x, 5, actions=us)
        assert spaced.dtype == jnp.float32
        np.testing.assert_allclose(spaced, expected, rtol=1e-5, atol=1e-6)


def test_simulate_half_precision_integrates_in_float32():
    """A bfloat16 or float16 state ran the default controller in half precision, which
    never met its tolerance: 100,000 steps, then diffrax's max_steps error."""
    x = jnp.array([1.5, 0.2])
    us = jnp.linspace(-1.0, 1.0, 3)[:, None]
    for system, actions in ((ls.Duffing(), None), (ls.ControlledPendulum(), us)):
        full = ls.simulate(system, x, 3, actions=actions)
        for dtype in (jnp.bfloat16, jnp.float16):
            cast = lambda a, t: None if a is None else a.astype(t)
            half = ls.simulate(system, x.astype(dtype), 3, actions=cast(actions, dtype))
            assert half.dtype == dtype
            # The float32 solution from the inputs as given, cast to their dtype.
            start, hold = (cast(cast(a, dtype), jnp.float32) for a in (x, actions))
            want = ls.simulate(system, start, 3, actions=hold).astype(dtype)
            np.testing.assert_array_equal(half.astype(jnp.float32), want.astype(jnp.float32))
            np.testing.assert_allclose(half.astype(jnp.float32), full, rtol=2e-2, atol=1e-2)


def test_batched_system_parameters(no_jaxtyping):
    """A system holding an array of parameters (a batch, for `filter_vmap`) is checked
    entry by entry: valid entries build and vmap, one invalid entry is named."""
    x = jnp.array([1.0, 0.0])
    gs = jnp.array([2.0, 4.0])
    batch = ls.Pendulum(g=gs)
    fields = eqx.filter_vmap(lambda s: s.vector_field(0.0, x, None))(batch)
    np.testing.assert_allclose(fields[:, 1], -gs * jnp.sin(1.0), rtol=1e-6)
    with pytest.raises(ValueError, match="Pendulum.g must be a positive, finite real number"):
        ls.Pendulum(g=jnp.array([2.0, 0.0]))
    # Array-valued fields sample too (traced under sample_trajectories' jit, or batched).
    for offset in (np.float32(5.0), jnp.asarray(5.0)):
        xs, _ = ls.sample_trajectories(ls.Pendulum(max_offset_deg=offset), jr.key(0), 64, 2)
        assert np.all(np.abs(xs[:, 0, 0] - np.pi) <= np.deg2rad(5.0) + 1e-6)
    offsets = jnp.array([10.0, 1.0])
    starts = eqx.filter_vmap(lambda s: s.sample_initial(jr.key(0), 64))(
        ls.Pendulum(max_offset_deg=offsets)
    )
    spread = np.abs(starts[..., 0] - np.pi).max(axis=1)
    assert np.all(spread <= np.deg2rad(offsets) + 1e-6) and spread[0] > np.deg2rad(1.0)


def test_array_parameters_are_traced_and_differentiable():
    """As documented: parameters given as JAX arrays are traced (one compilation for two
    values) and differentiable (against a central difference of the simulation)."""
    x0 = jnp.array([0.1, 0.0])
    final = eqx.filter_jit(lambda s: ls.simulate(s, x0, 20, solver=diffrax.Tsit5())[-1, 0])
    systems = ls.Pendulum(g=jnp.asarray(9.81)), ls.Pendulum(g=jnp.asarray(9.0))
    final(systems[0])
    with compilations() as compiled:
        final(systems[1])
    assert compiled == []  # the second value compiles nothing new
    grad = eqx.filter_grad(final)(ls.Pendulum(g=jnp.asarray(9.81))).g
    eps = 0.05
    fd = (
        final(ls.Pendulum(g=jnp.asarray(9.81 + eps)))
        - final(ls.Pendulum(g=jnp.asarray(9.81 - eps)))
    ) / (2 * eps)
    np.testing.assert_allclose(grad, fd, rtol=1e-2)


def test_simulate_forward_mode_with_forward_adjoint():
    """`adjoint=diffrax.ForwardMode()` gives `jax.jacfwd` through `simulate` (the default
    adjoint is reverse mode only), equal to `jax.jacrev` with the default."""
    x0 = jnp.array([0.5, 0.1])
    final = lambda adjoint: lambda x: ls.simulate(ls.Duffing(), x, 5, adjoint=adjoint)[-1]
    forward = jax.jacfwd(final(diffrax.ForwardMode()))(x0)
    np.testing.assert_allclose(forward, jax.jacrev(final(None))(x0), rtol=1e-5, atol=1e-7)
