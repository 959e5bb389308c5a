"""Dynamical systems: samplers, simulation accuracy against closed forms and invariants."""

import math

import jax.numpy as jnp
import jax.random as jr
import pytest

import lineax_seq as ls


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
    x = ls.Lorenz63().sample_initial(key, 2000)
    assert jnp.allclose(jnp.mean(x, axis=0), jnp.array([0.0, 1.0, 1.05]), atol=0.1)
    assert ls.Lorenz63().dt == 0.02 and ls.Duffing().dt == 0.01


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
    xs, us = ls.sample_trajectories(system, key, 2, 20)
    assert xs.shape == (2, 21, 2) and us.shape == (2, 20, 1)


def test_simulate_bad_inputs():
    with pytest.raises(ValueError, match="x0 has shape"):
        ls.simulate(ls.Duffing(), jnp.zeros(3), 10)
    with pytest.raises(ValueError, match="actions must be given"):
        ls.simulate(ls.Duffing(), jnp.zeros(2), 10, actions=jnp.zeros((10, 1)))
    with pytest.raises(ValueError, match="actions has shape"):
        ls.simulate(ls.ControlledPendulum(), jnp.zeros(2), 10, actions=jnp.zeros((9, 1)))
    with pytest.raises(ValueError, match="system='nope'"):
        ls.get_system("nope")
    for dt in (0.0, -0.1, float("inf")):
        with pytest.raises(ValueError, match=f"dt={dt!r} must be positive and finite"):
            ls.simulate(ls.Duffing(), jnp.zeros(2), 10, dt=dt)
    with pytest.raises(ValueError, match="x0 contains NaN"):
        ls.simulate(ls.Duffing(), jnp.array([0.0, jnp.nan]), 10)
    with pytest.raises(ValueError, match="steps=0"):
        ls.simulate(ls.Duffing(), jnp.zeros(2), 0)
    with pytest.raises(ValueError, match="num=0 must be a positive int"):
        ls.sample_trajectories(ls.Duffing(), jr.key(0), 0, 10)
