"""Koopman autoencoders: discretisation, unroll modes against step-by-step references,
the diffrax path against the matrix exponential, gradients, losses and bad inputs."""

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.scipy.linalg as jsl
import numpy as np
import pytest

import lineax_seq as ls

STEPS = 23


@pytest.fixture(scope="module")
def model():
    return ls.KoopmanAutoencoder(2, 6, width=8, key=jr.key(0))


@pytest.fixture(scope="module")
def controlled():
    return ls.KoopmanAutoencoder(2, 6, action_dim=1, action_latent_dim=3, width=8, key=jr.key(1))


@pytest.fixture(scope="module")
def mlp_dynamics():
    return ls.KoopmanAutoencoder(2, 6, dynamics="mlp", decoder="mlp", width=8, key=jr.key(2))


def reference_unroll(model, x0, actions, steps, k):
    """Step by step in Python: z <- Kbar z + Lbar omega(u); decode; every k: reencode."""
    if isinstance(model.dynamics, ls.LinearKoopmanDynamics):
        # Bilinear transform with explicit inverses (the library solves instead).
        n = model.latent_dim
        delta = float(jnp.exp(model.dynamics.log_delta))
        inv = np.linalg.inv(np.eye(n) - 0.5 * delta * np.asarray(model.dynamics.K))
        Kbar = inv @ (np.eye(n) + 0.5 * delta * np.asarray(model.dynamics.K))
        Lbar = None if model.dynamics.L is None else inv @ (delta * np.asarray(model.dynamics.L))

        def step(z, v):
            return Kbar @ z if v is None else Kbar @ z + Lbar @ v
    else:
        step = model.dynamics
    z = model.encode(x0)
    out = []
    for t in range(steps):
        v = None if actions is None else model.encode_action(actions[t])
        z = step(z, v)
        x = model.decode(z)
        out.append(x)
        if k is not None and (t + 1) % k == 0:
            z = model.encode(x)
    return jnp.stack(out)


@pytest.mark.parametrize("k", [None, 1, 5, 7])
def test_unroll_matches_step_by_step(model, controlled, mlp_dynamics, k):
    x0 = jnp.array([0.7, -0.3])
    actions = jr.normal(jr.key(3), (STEPS, 1))
    for m, u in [(model, None), (controlled, actions), (mlp_dynamics, None)]:
        expected = reference_unroll(m, x0, u, STEPS, k)
        for method in ("parallel", "sequential"):
            got = ls.unroll(m, x0, u, steps=STEPS, reencode_every=k, method=method)
            assert got.shape == (STEPS, 2)
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_long_unroll_without_reencoding_chains_chunks(model):
    # 300 steps > the internal chunk of 128: chunks must chain exactly.
    x0 = jnp.array([0.2, 0.1])
    expected = reference_unroll(model, x0, None, 300, None)
    np.testing.assert_allclose(ls.unroll(model, x0, steps=300), expected, rtol=1e-3, atol=1e-5)


def test_reencode_every_at_least_steps_is_no_reencoding(controlled):
    x0 = jnp.array([0.1, 0.4])
    u = jr.normal(jr.key(4), (STEPS, 1))
    base = ls.unroll(controlled, x0, u, steps=STEPS)
    for k in (STEPS, STEPS + 5):
        np.testing.assert_allclose(
            ls.unroll(controlled, x0, u, steps=STEPS, reencode_every=k), base, rtol=1e-6
        )
    # ... while reencoding does change the rollout (encoder/decoder are not inverses).
    assert not jnp.allclose(ls.unroll(controlled, x0, u, steps=STEPS, reencode_every=4), base)


def test_unroll_vmaps_over_initial_conditions(model):
    x0s = jr.normal(jr.key(5), (4, 2))
    batched = jax.vmap(lambda x: ls.unroll(model, x, steps=10, reencode_every=3))(x0s)
    single = jnp.stack([ls.unroll(model, x, steps=10, reencode_every=3) for x in x0s])
    np.testing.assert_allclose(batched, single, rtol=1e-5, atol=1e-6)


def test_bilinear_converges_to_expm_as_delta_shrinks():
    dyn = ls.LinearKoopmanDynamics(5, 2, dt=0.1, key=jr.key(6))
    exact = ls.LinearKoopmanDynamics(5, 2, dt=0.1, discretization="exact", key=jr.key(6))
    errors = []
    for delta in (0.1, 0.05, 0.025):
        d = eqx.tree_at(lambda m: m.log_delta, dyn, jnp.log(jnp.asarray(delta)))
        Kb, Lb = d.discretize()
        Ke, Le = eqx.tree_at(lambda m: m.log_delta, exact, d.log_delta).discretize()
        np.testing.assert_allclose(Ke, jsl.expm(delta * d.K), rtol=1e-5, atol=1e-6)
        errors.append(float(jnp.max(jnp.abs(Kb - Ke)) + jnp.max(jnp.abs(Lb - Le))))
    # Tustin is second-order accurate: local error O(delta^3), so ~8x per halving.
    assert errors[0] < 1e-3
    assert errors[0] / errors[1] > 5 and errors[1] / errors[2] > 5


def test_exact_control_matrix_is_the_zoh_integral():
    dyn = ls.LinearKoopmanDynamics(4, 1, dt=0.2, discretization="exact", key=jr.key(7))
    _, Lbar = dyn.discretize()
    s = jnp.linspace(0.0, 0.2, 2001)
    integrand = jax.vmap(lambda si: jsl.expm(si * dyn.K) @ dyn.L)(s)
    np.testing.assert_allclose(Lbar, jnp.trapezoid(integrand, s, axis=0), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("reencode_dt", [None, 0.05])
def test_unroll_continuous_matches_exact_path(model, reencode_dt):
    x0 = jnp.array([0.5, -0.4])
    ts = jnp.linspace(0.0, 0.2, 21)
    solver = ls.unroll_continuous(model, x0, ts, reencode_dt=reencode_dt)
    exact = ls.unroll_continuous(model, x0, ts, reencode_dt=reencode_dt, exact=True)
    assert exact.shape == (21, 2)
    np.testing.assert_allclose(solver, exact, rtol=1e-4, atol=1e-5)
    # On the grid the exact flow equals the unroll of the exactly discretised model
    # (t = 0 decodes the encoded initial state; reencoding every 5 grid steps).
    exact_model = ls.KoopmanAutoencoder(2, 6, width=8, discretization="exact", key=jr.key(0))
    k = None if reencode_dt is None else 5
    discrete = ls.unroll(exact_model, x0, steps=20, reencode_every=k)
    np.testing.assert_allclose(exact[1:], discrete, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(exact[0], model(x0), rtol=1e-5)


def test_unroll_continuous_nonlinear_dynamics_and_jit(mlp_dynamics):
    x0 = jnp.array([0.5, -0.4])
    ts = jnp.linspace(0.0, 0.1, 11)
    eager = ls.unroll_continuous(mlp_dynamics, x0, ts, reencode_dt=0.05)
    jitted = eqx.filter_jit(
        lambda m, x, t: ls.unroll_continuous(m, x, t, reencode_dt=0.05, num_segments=2)
    )(mlp_dynamics, x0, ts)
    np.testing.assert_allclose(eager, jitted, rtol=1e-5, atol=1e-6)
    # Euler steps of the same field approach the ODE solution as dt is small.
    discrete = ls.unroll(mlp_dynamics, x0, steps=10, reencode_every=5)
    np.testing.assert_allclose(discrete, eager[1:], atol=5e-3)


def test_gradients_through_diffrax_match_finite_differences():
    m = ls.KoopmanAutoencoder(2, 3, width=4, encoder_layers=2, key=jr.key(8))
    x0 = jnp.array([0.3, -0.2])
    ts = jnp.linspace(0.0, 0.3, 7)
    target = jnp.ones((7, 2))
    controller = diffrax.PIDController(rtol=1e-7, atol=1e-9)

    def loss(K):
        mk = eqx.tree_at(lambda mm: mm.dynamics.K, m, K)
        xs = ls.unroll_continuous(mk, x0, ts, reencode_dt=0.1, stepsize_controller=controller)
        return jnp.sum((xs - target) ** 2)

    K = m.dynamics.K
    grad = jax.grad(loss)(K)
    assert jnp.all(jnp.isfinite(grad))
    direction = jr.normal(jr.key(9), K.shape)
    eps = 1e-2
    fd = (loss(K + eps * direction) - loss(K - eps * direction)) / (2 * eps)
    np.testing.assert_allclose(jnp.vdot(grad, direction), fd, rtol=2e-2, atol=1e-4)


def test_losses_match_hand_computation(model):
    xs = jr.normal(jr.key(10), (5, 2))
    loss, terms = ls.koopman_loss(model, xs, prediction=0.5)
    zs = jnp.stack([model.encode(x) for x in xs])
    zhat = ls.unroll_latents(model, xs[0], steps=4)
    align = sum(jnp.linalg.norm(zhat[i] - zs[i + 1]) for i in range(4))
    recon = sum(jnp.linalg.norm(xs[i] - model.decode(zs[i])) for i in range(5))
    pred = sum(jnp.linalg.norm(xs[i + 1] - model.decode(zhat[i])) for i in range(4))
    sparse = jnp.sum(jnp.abs(zs))
    np.testing.assert_allclose(terms["alignment"], align, rtol=1e-5)
    np.testing.assert_allclose(terms["reconstruction"], recon, rtol=1e-5)
    np.testing.assert_allclose(loss, align + recon + 0.5 * pred + 1e-3 * sparse, rtol=1e-5)
    base = ls.MLPBaseline(2, width=8, key=jr.key(11))
    xb = ls.unroll(base, xs[0], steps=4)
    np.testing.assert_allclose(base(base(xs[0])), xb[1], rtol=1e-6)
    expected = sum(jnp.linalg.norm(xs[i + 1] - xb[i]) for i in range(4))
    np.testing.assert_allclose(ls.mlp_baseline_loss(base, xs), expected, rtol=1e-5)


def test_linear_decoder_columns_have_unit_norm(model):
    w = model.decoder.normalized_weight()
    np.testing.assert_allclose(jnp.linalg.norm(w, axis=0), 1.0, rtol=1e-5)
    assert model.dynamics.delta == pytest.approx(0.01)


def test_bad_inputs(model, controlled):
    x0 = jnp.array([0.1, 0.2])
    with pytest.raises(ValueError, match="x0 has shape"):
        ls.unroll(model, jnp.zeros(3), steps=5)
    with pytest.raises(ValueError, match="actions has shape"):
        ls.unroll(controlled, x0, jnp.zeros((4, 1)), steps=5)
    with pytest.raises(ValueError, match="actions are required"):
        ls.unroll(controlled, x0, steps=5)
    for k in (0, -3):
        with pytest.raises(ValueError, match="reencode_every"):
            ls.unroll(model, x0, steps=5, reencode_every=k)
    with pytest.raises(ValueError, match="NaN"):
        ls.unroll(model, jnp.array([jnp.nan, 0.0]), steps=5)
    with pytest.raises(Exception, match="NaN"):
        jax.jit(lambda x: ls.unroll(model, x, steps=5))(jnp.array([jnp.nan, 0.0]))
    with pytest.raises(ValueError, match="strictly increasing"):
        ls.unroll_continuous(model, x0, jnp.array([0.0, 0.2, 0.1]))
    with pytest.raises(ValueError, match="strictly increasing"):
        ls.unroll_continuous(model, x0, jnp.array([0.0, 0.1, 0.1]))
    with pytest.raises(ValueError, match="autonomous"):
        ls.unroll_continuous(controlled, x0, jnp.linspace(0.0, 1.0, 3))
    with pytest.raises(ValueError, match="decoder='conv'"):
        ls.KoopmanAutoencoder(2, 4, decoder="conv", key=jr.key(0))
    with pytest.raises(ValueError, match="discretization='euler'"):
        ls.LinearKoopmanDynamics(4, discretization="euler", key=jr.key(0))
    with pytest.raises(ValueError, match="MLPBaseline"):
        ls.unroll(ls.MLPBaseline(2, width=4, key=jr.key(0)), x0, steps=5, reencode_every=2)
