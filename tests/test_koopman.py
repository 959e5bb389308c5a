"""Koopman autoencoders: discretisation, unroll modes against step-by-step references,
the diffrax path against the matrix exponential, gradients, losses and bad inputs."""

import json
import math
import pickle
import warnings

import diffrax
import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp
import jax.random as jr
import jax.scipy.linalg as jsl
import jax.test_util
import jaxtyping
import numpy as np
import pytest
from _compiles import compilations
from _devices import assert_check_fails

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


def reference_unroll(model, x0, actions, steps, k, *, latents=False):
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
        step = jax.jit(lambda z, v: model.dynamics(z, v))
    encode, decode = jax.jit(lambda x: model.encode(x)), jax.jit(lambda z: model.decode(z))
    encode_action = None if actions is None else jax.jit(lambda u: model.encode_action(u))
    z = encode(x0)
    out = []
    for t in range(steps):
        v = None if actions is None else encode_action(actions[t])
        z = step(z, v)
        x = decode(z)
        out.append(z if latents else x)
        if k is not None and (t + 1) % k == 0:
            z = encode(x)
    return jnp.stack(out)


@pytest.mark.parametrize("k", [None, 1, 7])
def test_unroll_matches_step_by_step(model, controlled, mlp_dynamics, k):
    x0 = jnp.array([0.7, -0.3])
    actions = jr.normal(jr.key(3), (STEPS, 1))
    for m, u in [(model, None), (controlled, actions), (mlp_dynamics, None)]:
        expected = reference_unroll(m, x0, u, STEPS, k)
        for method in ("parallel", "sequential"):
            got = ls.unroll(m, x0, u, steps=STEPS, reencode_every=k, method=method)
            assert got.shape == (STEPS, 2)
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    # The linear model's parallel unroll folds the decoder into the powers of Kbar; the
    # latent path (used by the losses) must agree with the reference latents too.
    zs = ls.unroll_latents(model, x0, steps=STEPS, reencode_every=k)
    expected = reference_unroll(model, x0, None, STEPS, k, latents=True)
    np.testing.assert_allclose(zs, expected, rtol=1e-4, atol=1e-5)


def test_learned_step_size_and_decoder_bias_reach_every_path(model, mlp_dynamics):
    """A trained model has `delta != dt` and a nonzero decoder bias (they start at `dt` and
    0, where leaving either out changes nothing): every unroll must use both."""
    x0, bias = jnp.array([0.5, -0.4]), jnp.array([0.3, -0.2])
    delta = jnp.asarray(0.03)  # 3 dt
    lin = eqx.tree_at(
        lambda m: (m.dynamics.log_delta, m.decoder.bias), model, (jnp.log(delta), bias)
    )
    K = lin.dynamics.K
    np.testing.assert_allclose(lin.dynamics.generator(), 3 * K, rtol=1e-6)
    for k in (None, 5):  # the reference takes its Tustin steps with delta, not dt
        expected = reference_unroll(lin, x0, None, STEPS, k)
        for method in ("parallel", "sequential"):
            got = ls.unroll(lin, x0, steps=STEPS, reencode_every=k, method=method)
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=method)
    # In the data's time units the latent flow is exp(t (delta / dt) K).
    ts = jnp.linspace(0.0, 0.2, 11)
    z0 = lin.encode(x0)
    want = jax.vmap(lambda t: lin.decode(jsl.expm(t * 3 * K) @ z0))(ts)
    for exact in (False, True):
        got = ls.unroll_continuous(lin, x0, ts, exact=exact)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"exact={exact}")
    # MLP dynamics: an Euler step of delta, a field of (delta / dt) mlp(z).
    dyn = eqx.tree_at(lambda d: d.log_delta, mlp_dynamics.dynamics, jnp.log(jnp.asarray(0.05)))
    z = jr.normal(jr.key(41), (dyn.latent_dim,))
    np.testing.assert_allclose(dyn(z), z + 0.05 * dyn.mlp(z), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dyn.vector_field(z), 5 * dyn.mlp(z), rtol=1e-5, atol=1e-6)


def test_reencode_is_decode_then_encode(model, mlp_dynamics):
    """`reencode` is `phi(psi(z))`, and an unroll with `reencode_every=k` is the plain
    step loop that calls it every `k` steps (before which the latent is recorded)."""
    z = jr.normal(jr.key(40), (model.latent_dim,))
    for m in (model, mlp_dynamics):  # linear / MLP decoder and dynamics
        got = m.reencode(z)
        assert got.shape == (m.latent_dim,)
        np.testing.assert_allclose(got, m.encode(m.decode(z)), rtol=1e-6, atol=1e-7)
    x0, k = jnp.array([0.4, -0.6]), 5
    step = eqx.filter_jit(lambda m, z: m.step(z))
    reencode = eqx.filter_jit(lambda m, z: m.reencode(z))
    for m in (model, mlp_dynamics):
        z, expected = m.encode(x0), []
        for t in range(STEPS):
            z = step(m, z)
            expected.append(z)
            if (t + 1) % k == 0:
                z = reencode(m, z)
        for method in ("parallel", "sequential"):
            zs = ls.unroll_latents(m, x0, steps=STEPS, reencode_every=k, method=method)
            np.testing.assert_allclose(zs, jnp.stack(expected), rtol=1e-4, atol=1e-5)


def test_long_unroll_without_reencoding_chains_chunks(model):
    # 300 steps > the internal chunk of 128: chunks must chain exactly.
    x0 = jnp.array([0.2, 0.1])
    expected = reference_unroll(model, x0, None, 300, None)
    # (atol: float32 over 300 steps, 2e-4 of the states' scale; on an H200 1.6e-5 apart.)
    np.testing.assert_allclose(ls.unroll(model, x0, steps=300), expected, rtol=1e-3, atol=5e-5)


def _shapes(jaxpr) -> set[tuple[int, ...]]:
    """The shapes of every value in `jaxpr` and the jaxprs inside it (scans, conds)."""
    shapes = set()
    for eqn in jaxpr.eqns:
        shapes |= {tuple(v.aval.shape) for v in eqn.outvars}
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    shapes |= _shapes(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    shapes |= _shapes(sub)
    return shapes


@pytest.mark.parametrize("k", [129, 200])
def test_long_reencoding_periods_are_chunked(controlled, mlp_dynamics, k):
    """A period longer than the internal chunk of 128 steps is cut into chunks (129 into
    two of 65, the second padded by a step; 200 into two of 100), still reencoding after
    exactly `k` steps; the table of powers of `Kbar` stays a chunk long (it was
    `(k, n, n)`: 2.3 GB at a period of 1,000, latent 384, batch 8)."""
    x0 = jnp.array([0.5, -0.2])
    actions = jr.normal(jr.key(30), (300, 1))
    decoded_latents = ls.KoopmanAutoencoder(2, 6, decoder="mlp", width=8, key=jr.key(31))
    for m, u in [(controlled, actions), (mlp_dynamics, None), (decoded_latents, None)]:
        expected = reference_unroll(m, x0, u, 300, k)
        got = ls.unroll(m, x0, u, steps=300, reencode_every=k)
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)
    n = controlled.latent_dim
    jaxpr = jax.make_jaxpr(lambda x: ls.unroll(controlled, x, actions, steps=300, reencode_every=k))
    tables = {s for s in _shapes(jaxpr(x0).jaxpr) if len(s) == 3 and s[1:] == (n, n)}
    assert tables and max(s[0] for s in tables) <= 128


def test_reencode_every_at_least_steps_is_no_reencoding(controlled):
    x0 = jnp.array([0.1, 0.4])
    u = jr.normal(jr.key(4), (STEPS, 1))
    base = ls.unroll(controlled, x0, u, steps=STEPS)
    np.testing.assert_allclose(
        ls.unroll(controlled, x0, u, steps=STEPS, reencode_every=STEPS + 5), base, rtol=1e-6
    )
    # ... while reencoding does change the rollout (encoder/decoder are not inverses).
    assert not jnp.allclose(ls.unroll(controlled, x0, u, steps=STEPS, reencode_every=4), base)


def test_unroll_vmaps_over_initial_conditions(model):
    x0s = jr.normal(jr.key(5), (3, 2))
    batched = jax.vmap(lambda x: ls.unroll(model, x, steps=10, reencode_every=3))(x0s)
    single = jnp.stack([ls.unroll(model, x, steps=10, reencode_every=3) for x in x0s])
    np.testing.assert_allclose(batched, single, rtol=1e-5, atol=1e-6)


def test_eager_unroll_compiles_once(model, controlled):
    """Called outside `jit`, as in the README, the unrolls compile once per configuration,
    not on every call (their scans' bodies are fresh closures)."""
    x0 = jnp.array([0.3, -0.2])
    actions = jnp.ones((STEPS, 1))
    calls = [
        lambda x: ls.unroll(model, x, steps=STEPS, reencode_every=5),
        lambda x: ls.unroll(controlled, x, actions, steps=STEPS, method="sequential"),
        lambda x: ls.unroll_latents(model, x, steps=STEPS),
        lambda x: jax.vmap(lambda x: ls.unroll(model, x, steps=STEPS))(jnp.stack([x, -x])),
        lambda x: ls.unroll_continuous(model, x, jnp.linspace(0, 1, 5), reencode_dt=0.5),
        lambda x: ls.unroll_continuous(model, x, np.linspace(0, 1, 5), exact=True),
        # A new fixed step size (x0 > 0: 0.05, else 0.1) compiles nothing new either.
        lambda x: ls.unroll_continuous(
            model, x, jnp.linspace(0, 1, 5), solver=diffrax.Heun(), dt0=0.05 * (1 + float(x[0] < 0))
        ),
    ]
    for call in calls:
        call(x0)
    with compilations() as compiled:
        for call in calls:
            call(-x0)  # new values, same configuration
    assert compiled == []


def test_bilinear_converges_to_expm_as_delta_shrinks():
    dyn = ls.LinearKoopmanDynamics(5, 2, dt=0.1, key=jr.key(6))
    exact = ls.LinearKoopmanDynamics(5, 2, dt=0.1, discretization="exact", key=jr.key(6))

    @jax.jit
    def both(log_delta):
        set_delta = lambda m: eqx.tree_at(lambda m: m.log_delta, m, log_delta)
        return set_delta(dyn).discretize(), set_delta(exact).discretize()

    errors = []
    for delta in (0.1, 0.05, 0.025):
        (Kb, Lb), (Ke, Le) = both(jnp.log(jnp.asarray(delta)))
        np.testing.assert_allclose(Ke, jsl.expm(delta * dyn.K), rtol=1e-5, atol=1e-6)
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


def test_unroll_continuous_matches_exact_path(model):
    reencode_dt = 0.05
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
    np.testing.assert_allclose(exact[0], model(x0), rtol=1e-5, atol=1e-7)  # jit vs eager


def test_unroll_continuous_nonlinear_dynamics_and_jit(mlp_dynamics):
    x0 = jnp.array([0.5, -0.4])
    ts = jnp.linspace(0.0, 0.1, 11)
    eager = ls.unroll_continuous(mlp_dynamics, x0, ts, reencode_dt=0.05)
    jitted = eqx.filter_jit(
        lambda m, x, t: ls.unroll_continuous(m, x, t, reencode_dt=0.05, num_segments=2)
    )(mlp_dynamics, x0, ts)
    np.testing.assert_allclose(eager, jitted, rtol=1e-5, atol=1e-6)
    # A NumPy grid closed over by a jitted function is a constant: no num_segments needed
    # (it was refused as traced, since converting it inside the trace made a tracer).
    ts_np = np.linspace(0.0, 0.1, 11)
    closed = eqx.filter_jit(
        lambda x: ls.unroll_continuous(mlp_dynamics, x, ts_np, reencode_dt=0.05)
    )
    np.testing.assert_allclose(closed(x0), eager, rtol=1e-5, atol=1e-6)
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
    grad = jax.jit(jax.grad(loss))(K)
    loss = jax.jit(loss)
    assert jnp.all(jnp.isfinite(grad))
    direction = jr.normal(jr.key(9), K.shape)
    eps = 1e-2
    fd = (loss(K + eps * direction) - loss(K - eps * direction)) / (2 * eps)
    np.testing.assert_allclose(jnp.vdot(grad, direction), fd, rtol=2e-2, atol=1e-4)


def test_gradients_of_the_discrete_unrolls_match_finite_differences():
    """Reverse-mode gradients of `unroll` (in every parameter and in x0) against central
    differences in float64: parallel (powers of Kbar, with and without actions) and
    sequential, with and without periodic reencoding, and the MLP dynamics."""
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        models = [
            ls.KoopmanAutoencoder(2, 4, width=5, key=jr.key(0)),
            ls.KoopmanAutoencoder(2, 4, action_dim=1, width=5, key=jr.key(1)),
            ls.KoopmanAutoencoder(2, 4, dynamics="mlp", decoder="mlp", width=5, key=jr.key(2)),
        ]
        params, static = eqx.partition(models, eqx.is_inexact_array)
        flat, unravel = jax.flatten_util.ravel_pytree(params)
        assert flat.dtype == jnp.float64
        actions = 0.3 * jr.normal(jr.key(3), (7, 1), jnp.float64)

        @jax.jit
        def paths(flat, x0):
            free, forced, mlp = eqx.combine(unravel(flat), static)
            return [
                ls.unroll(m, x0, us, steps=7, reencode_every=k, method=method)
                for m, us in ((free, None), (forced, actions), (mlp, None))
                for k in (None, 3)
                for method in ("parallel", "sequential")
                if m is free or method == "parallel"
            ]

        x0 = jnp.array([0.3, -0.2])
        jax.test_util.check_grads(paths, (flat, x0), order=1, modes="rev", eps=1e-6)


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
    loss, terms = ls.mlp_baseline_loss(base, xs)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    # The same `(loss, terms)` as koopman_loss, its one term under koopman_loss's key.
    assert loss.shape == () and set(terms) == {"prediction"}
    np.testing.assert_allclose(terms["prediction"], expected, rtol=1e-5)


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
    traced = jax.jit(lambda x: ls.unroll(model, x, steps=5))
    assert_check_fails("NaN", traced, jnp.array([jnp.nan, 0.0]))
    with pytest.raises(ValueError, match="strictly increasing"):
        ls.unroll_continuous(model, x0, jnp.array([0.0, 0.2, 0.1]))
    with pytest.raises(ValueError, match="strictly increasing"):
        ls.unroll_continuous(model, x0, jnp.array([0.0, 0.1, 0.1]))
    with pytest.raises(ValueError, match="action_dim=1: actions are required"):
        ls.unroll_continuous(controlled, x0, jnp.linspace(0.0, 1.0, 3))
    with pytest.raises(ValueError, match="decoder='conv'"):
        ls.KoopmanAutoencoder(2, 4, decoder="conv", key=jr.key(0))
    with pytest.raises(ValueError, match="discretization='euler'"):
        ls.LinearKoopmanDynamics(4, discretization="euler", key=jr.key(0))
    with pytest.raises(ValueError, match="MLPBaseline"):
        ls.unroll(ls.MLPBaseline(2, width=4, key=jr.key(0)), x0, steps=5, reencode_every=2)


def test_unroll_continuous_times_laid_out_anew_compile_nothing(model):
    """Concrete `ts` spread differently over the reencoding segments (at most 5, 7 and 6
    times in one: its solve saves at 8 a segment either way) reuse the compiled solve,
    whether or not the number of times changes (10, 10, 8); only the small programs that
    pick and decode the states at `ts` follow that number. All equal the exact path."""
    x0 = jnp.array([-0.6, 0.3])
    layouts = [
        np.array([0.0, 0.01, 0.02, 0.03, 0.04, 0.11, 0.12, 0.13, 0.14, 0.15], np.float32),
        np.array([0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.11, 0.12, 0.15], np.float32),
        np.array([0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.11, 0.15], np.float32),
    ]
    got = [ls.unroll_continuous(model, x0, layouts[0], reencode_dt=0.1)]
    with compilations() as compiled:
        got.append(ls.unroll_continuous(model, x0, layouts[1], reencode_dt=0.1))
    assert compiled == []
    with compilations() as compiled:
        got.append(ls.unroll_continuous(model, x0, layouts[2], reencode_dt=0.1))
    assert "jit(_decode_at)" in compiled and not any("_solve" in name for name in compiled)
    for ts, xs in zip(layouts, got, strict=True):
        exact = ls.unroll_continuous(model, x0, ts, reencode_dt=0.1, exact=True)
        np.testing.assert_allclose(xs, exact, rtol=1e-4, atol=1e-5)


def test_unroll_continuous_irregular_times_concrete_and_traced(model):
    # Irregular output times: the host path (concrete ts: per-segment save times, one
    # exponential per distinct offset) and the traced path (ts a jit argument) agree.
    x0 = jnp.array([-0.6, 0.3])
    ts = jnp.cumsum(jr.uniform(jr.key(12), (15,), minval=0.002, maxval=0.03))
    concrete = ls.unroll_continuous(model, x0, ts, reencode_dt=0.07)
    exact = ls.unroll_continuous(model, x0, ts, reencode_dt=0.07, exact=True)
    num = int(np.ceil(float(ts[-1] - ts[0]) / 0.07 - 1e-6))

    @jax.jit
    def traced(x0, ts):
        return (
            ls.unroll_continuous(model, x0, ts, reencode_dt=0.07, num_segments=num, exact=True),
            # closed-over times are concrete inside jit: the host path again
            ls.unroll_continuous(model, x0, ts_closed, reencode_dt=0.07, exact=True),
        )

    ts_closed = ts
    exact_traced, exact_closed = traced(x0, ts)
    for got in (concrete, exact_traced, exact_closed):
        np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-5)
    # An MLP decoder is not folded into the flows: same agreement.
    mlp_decoder = ls.KoopmanAutoencoder(2, 6, decoder="mlp", width=8, key=jr.key(18))
    np.testing.assert_allclose(
        ls.unroll_continuous(mlp_decoder, x0, ts, reencode_dt=0.07, exact=True),
        ls.unroll_continuous(mlp_decoder, x0, ts, reencode_dt=0.07),
        rtol=1e-4,
        atol=1e-5,
    )
    # Without reencoding: one segment; the prediction differs (reencoding happened).
    plain = ls.unroll_continuous(model, x0, ts, exact=True)
    np.testing.assert_allclose(ls.unroll_continuous(model, x0, ts), plain, rtol=1e-4, atol=1e-5)
    assert not jnp.allclose(plain, exact, atol=1e-4)


def test_training_objective_with_reencoding_and_action_head():
    m = ls.KoopmanAutoencoder(2, 5, action_dim=1, width=8, action_head=True, key=jr.key(13))
    xs = jr.normal(jr.key(14), (7, 2))
    us = jr.normal(jr.key(15), (6, 1))
    weights = dict(alignment=0.3, reconstruction=2.0, prediction=0.7, sparsity=0.01, action=0.5)

    @eqx.filter_jit
    def objective(m, xs, us):
        loss, terms = ls.koopman_loss(m, xs, us, reencode_every=2, **weights)
        # The step size is trained in log space: the loss depends on log_delta.
        default = lambda m: ls.koopman_loss(m, xs, us, reencode_every=2)[0]
        default_loss, grads = eqx.filter_value_and_grad(default)(m)
        return loss, terms, grads, default_loss

    @eqx.filter_jit
    def hand_computed(m, xs, us, zhat):
        # The terms one by one, as written in the paper (Python loops, unrolled).
        zs = jnp.stack([m.encode(x) for x in xs])
        return {
            "alignment": sum(jnp.linalg.norm(zhat[i] - zs[i + 1]) for i in range(6)),
            "reconstruction": sum(jnp.linalg.norm(xs[i] - m.decode(zs[i])) for i in range(7)),
            "prediction": sum(jnp.linalg.norm(xs[i + 1] - m.decode(zhat[i])) for i in range(6)),
            "sparsity": jnp.sum(jnp.abs(zs)),
            "action": sum(jnp.linalg.norm(us[i] - m.predict_action(zs[i])) for i in range(6)),
        }

    loss, terms, grads, default_loss = objective(m, xs, us)
    zhat = reference_unroll(m, xs[0], us, 6, 2, latents=True)  # before reencoding
    expected = hand_computed(m, xs, us, zhat)
    assert set(terms) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(terms[name], value, rtol=1e-4, err_msg=name)
    np.testing.assert_allclose(loss, sum(weights[n] * v for n, v in expected.items()), rtol=1e-4)
    # The documented defaults: alignment 1, reconstruction 1, prediction 0, sparsity 1e-3,
    # and the action head's term 1 when there is one.
    defaults = dict(alignment=1.0, reconstruction=1.0, prediction=0.0, sparsity=1e-3, action=1.0)
    want = sum(defaults[n] * v for n, v in expected.items())
    np.testing.assert_allclose(default_loss, want, rtol=1e-4)
    assert jnp.isfinite(grads.dynamics.log_delta) and grads.dynamics.log_delta != 0


def test_semi_open_loop_action_head_on_autonomous_dynamics():
    """Section 1.4.3: actions follow from the states (`u = pi(x)`), so the dynamics are
    autonomous (`z_{t+1} = K z_t`) and the actions are the head's targets only. Before,
    an action head forced controlled dynamics, whose unroll needs the actions."""
    m = ls.KoopmanAutoencoder(2, 5, width=8, action_head=True, head_action_dim=3, key=jr.key(3))
    assert (m.action_dim, m.head_action_dim, m.action_encoder) == (0, 3, None)
    xs, us = jr.normal(jr.key(4), (5, 2)), jr.normal(jr.key(5), (4, 3))

    @eqx.filter_jit
    def losses(m, xs, us):
        return (
            ls.koopman_loss(m, xs, us)[1],
            ls.koopman_loss(m, xs)[1],
            ls.unroll(m, xs[0], steps=4),
        )

    with_targets, without, states = losses(m, xs, us)
    assert "action" not in without and states.shape == (4, 2)
    for name, value in without.items():  # the actions do not drive the dynamics
        np.testing.assert_allclose(with_targets[name], value, rtol=1e-6, err_msg=name)
    heads = jax.vmap(lambda x: m.predict_action(m.encode(x)))(xs[:-1])
    want = jnp.sum(jnp.linalg.norm(us - heads, axis=-1))
    np.testing.assert_allclose(with_targets["action"], want, rtol=1e-5)
    with pytest.raises(ValueError, match=r"head's targets \(steps, head_action_dim\) = \(4, 3\)"):
        ls.koopman_loss(m, xs, us[:, :1])
    with pytest.raises(ValueError, match="actions contains NaN or inf"):
        ls.koopman_loss(m, xs, us.at[0, 0].set(jnp.nan))
    with pytest.raises(ValueError, match="action_dim=0"):  # the unroll takes no actions
        ls.unroll(m, xs[0], us, steps=4)
    make = lambda **kw: ls.KoopmanAutoencoder(2, 4, width=8, key=jr.key(0), **kw)
    with pytest.raises(ValueError, match="head_action_dim=2 is the action head's output size"):
        make(head_action_dim=2)
    with pytest.raises(ValueError, match="with controls \\(action_dim=1\\) the head predicts"):
        make(action_dim=1, action_head=True, head_action_dim=2)
    with pytest.raises(ValueError, match="action_dim > 0 .* or head_action_dim > 0"):
        make(action_head=True)
    assert make(action_dim=1, action_head=True).head_action_dim == 1


def test_mlp_baseline_with_controls_is_autoregressive():
    base = ls.MLPBaseline(2, 1, width=8, layers=3, key=jr.key(16))
    x0 = jnp.array([0.2, -0.1])
    us = jr.normal(jr.key(17), (5, 1))
    x, expected = x0, []
    for u in us:
        x = x + base.mlp(jnp.concatenate([x, u]))
        expected.append(x)
    np.testing.assert_allclose(ls.unroll(base, x0, us, steps=5), jnp.stack(expected), rtol=1e-5)


def test_more_bad_inputs(model):
    x0 = jnp.array([0.1, 0.2])
    ts = jnp.linspace(0.0, 0.1, 5)
    with pytest.raises(ValueError, match="steps=0"):
        ls.unroll(model, x0, steps=0)
    with pytest.raises(ValueError, match="method='fast'"):
        ls.unroll(model, x0, steps=3, method="fast")
    with pytest.raises(ValueError, match="reencode_every=True"):
        ls.unroll(model, x0, steps=3, reencode_every=True)
    with pytest.raises(ValueError, match="NaN"):
        ls.unroll_continuous(model, jnp.array([0.0, jnp.inf]), ts)
    with pytest.raises(ValueError, match="traced ts .*build it with NumPy.*pass num_segments"):
        jax.jit(lambda t: ls.unroll_continuous(model, x0, t, reencode_dt=0.05))(ts)
    exact = jax.jit(lambda t: ls.unroll_continuous(model, x0, t, exact=True))
    assert_check_fails("strictly increasing", exact, ts[::-1])
    with pytest.raises(ValueError, match="reencode_dt"):
        ls.unroll_continuous(model, x0, ts, reencode_dt=0.0)
    mlp = ls.KoopmanAutoencoder(2, 4, dynamics="mlp", width=4, key=jr.key(0))
    with pytest.raises(ValueError, match="exact=True"):
        ls.unroll_continuous(mlp, x0, ts, exact=True)
    with pytest.raises(ValueError, match="action_head"):
        ls.KoopmanAutoencoder(2, 4, action_head=True, key=jr.key(0))
    with pytest.raises(ValueError, match="latent_dim=0"):
        ls.KoopmanAutoencoder(2, 0, key=jr.key(0))
    # A wrong shape fails the run-time type check, naming the argument.
    with pytest.raises(Exception, match="x0"):
        ls.unroll_continuous(model, jnp.zeros((2, 2)), ts)


def test_model_entry_points_refuse_lists_and_non_float_states(no_jaxtyping, model, controlled):
    """Lists failed by an attribute (`'list' object has no attribute 'shape'`), and
    integer or complex states computed silently in the wrong dtype."""
    baseline = ls.MLPBaseline(2, width=4, key=jr.key(0))
    z = jnp.zeros(model.latent_dim)
    calls = {
        "x": [model, model.encode, baseline, lambda x: controlled(x)],
        "z": [model.decode, model.dynamics, model.dynamics.step, model.dynamics.vector_field],
    }
    bad = {"x": jnp.array([1, 2]), "z": z.astype(jnp.complex64)}
    for name, fns in calls.items():
        for fn in fns:
            with pytest.raises(TypeError, match=f"{name} must be a JAX or NumPy array"):
                fn(list(np.asarray(bad[name]).real))
            with pytest.raises(TypeError, match=f"{name} must have a real floating dtype"):
                fn(bad[name])
    u = jnp.array([1], jnp.int32)
    with pytest.raises(TypeError, match=r"u must have a real floating dtype, got u.dtype=int32"):
        controlled.encode_action(u)


def test_unroll_continuous_exact_keeps_close_times_apart(model):
    """Output times two float32 ulps apart (at 1e6) are distinct: the host path's one
    exponential per distinct offset must not merge them (it did, within 4 ulps)."""
    fast = eqx.tree_at(lambda m: m.dynamics.K, model, 5 * model.dynamics.K)
    x0 = jnp.array([0.4, -0.1])
    ts = jnp.float32(1e6) + 0.125 * jnp.arange(6.0)
    concrete = ls.unroll_continuous(fast, x0, ts, exact=True)
    traced = jax.jit(lambda t: ls.unroll_continuous(fast, x0, t, exact=True))(ts)
    np.testing.assert_allclose(concrete, traced, rtol=1e-4, atol=1e-5)
    assert np.all(np.abs(np.diff(concrete, axis=0)).max(axis=1) > 1e-3)
    # At small time scales too: times 1e-8 apart (with a generator ~1e8 times faster)
    # give the flow at 1-spaced times of the original model, not merged outputs.
    tiny = eqx.tree_at(lambda m: m.dynamics.K, fast, 1e8 * fast.dynamics.K)
    small = ls.unroll_continuous(tiny, x0, jnp.float32(1e-8) * jnp.arange(6.0), exact=True)
    np.testing.assert_allclose(
        small, ls.unroll_continuous(fast, x0, jnp.arange(6.0), exact=True), rtol=1e-4, atol=1e-5
    )


def test_unroll_continuous_backsolve_adjoint_and_fixed_steps(model):
    """Any diffrax adjoint differentiates through the dynamics (they are the ODE's args,
    not closed over), and any solver is accepted, e.g. fixed-step Euler."""
    x0, ts = jnp.array([0.3, -0.2]), jnp.linspace(0.0, 0.1, 5)

    def grads(adjoint):
        loss = lambda m: jnp.sum(
            ls.unroll_continuous(m, x0, ts, reencode_dt=0.05, adjoint=adjoint) ** 2
        )
        return eqx.filter_jit(eqx.filter_grad(loss))(model).dynamics.K

    np.testing.assert_allclose(grads(diffrax.BacksolveAdjoint()), grads(None), rtol=1e-3, atol=1e-5)

    @eqx.filter_jit
    def euler_and_exact(model, x0):
        # One compilation; `ts` closed over is concrete, as outside `jit` (the host path).
        euler = ls.unroll_continuous(
            model, x0, ts, solver=diffrax.Euler(), stepsize_controller=diffrax.ConstantStepSize(),
            dt0=1e-4,
        )  # fmt: skip
        return euler, ls.unroll_continuous(model, x0, ts, exact=True)

    np.testing.assert_allclose(*euler_and_exact(model, x0), atol=1e-3)


def test_loss_norms_in_half_precision():
    """The loss's norms carry 1e-12 under the root for a safe gradient at zero, summed in
    at least float32: in float16 the 1e-12 was 0 (a zero residual's gradient NaN) and a
    row of 300s overflowed to inf."""
    from lineax_seq.koopman._losses import _norms

    for dtype in (jnp.float16, jnp.bfloat16):
        rows = jnp.zeros((2, 3), dtype).at[1].set(300.0)
        norms = _norms(rows)
        grad = jax.grad(lambda a: _norms(a)[0].astype(jnp.float32))(rows)
        assert norms.dtype == dtype and np.isfinite(np.asarray(grad, np.float32)).all()
        np.testing.assert_allclose(np.asarray(norms, np.float32), [1e-6, 519.6], rtol=2e-2)


def test_continuous_and_loss_bad_inputs(model, controlled):
    x0, ts = jnp.array([0.1, 0.2]), jnp.linspace(0.0, 0.1, 5)
    with pytest.raises(ValueError, match="num_segments=1, but ts spans 0.1 = 2 segments"):
        ls.unroll_continuous(model, x0, ts, reencode_dt=0.05, num_segments=1)
    with pytest.raises(ValueError, match="num_segments=3 must be 1"):
        ls.unroll_continuous(model, x0, ts, num_segments=3)
    one = jax.jit(lambda t: ls.unroll_continuous(model, x0, t, reencode_dt=0.05, num_segments=1))
    assert_check_fails("num_segments=1 is fewer", one, ts)
    with pytest.raises(ValueError, match="reencode_dt=inf"):
        ls.unroll_continuous(model, x0, ts, reencode_dt=float("inf"))
    # Half precision: 0.1 is 0.09998 in float16, which reencoded at 0.7 before 0.71.
    for half in (np.float16(0.05), jnp.asarray(0.05, jnp.bfloat16)):
        with pytest.raises(ValueError, match=r"reencode_dt=0\.0[45]\d* is a b?float16 scalar"):
            ls.unroll_continuous(model, x0, ts, reencode_dt=half)
    with pytest.raises(ValueError, match="ts must be finite"):
        ls.unroll_continuous(model, x0, ts.at[2].set(jnp.nan))
    with pytest.raises(ValueError, match="actions contains NaN"):
        ls.unroll(controlled, x0, jnp.full((3, 1), jnp.nan), steps=3)
    with pytest.raises((ValueError, TypeError), match="steps"):
        ls.unroll_latents(model, x0, steps=2.0)
    # Type-checked without jaxtyping's import hook too, like `unroll`.
    with pytest.raises(jaxtyping.TypeCheckError, match="steps"):
        ls.unroll_latents.__wrapped__(model, x0, steps=2.0)
    with pytest.raises(TypeError, match="KoopmanAutoencoder"):
        ls.unroll_latents(ls.MLPBaseline(2, width=4, key=jr.key(0)), x0, steps=2)
    with pytest.raises(ValueError, match=r"x must have shape \(2,\), got x.shape=\(4,\)"):
        model.encode(jnp.ones(4))
    with pytest.raises(ValueError, match=r"z must have shape \(6,\), got z.shape=\(4,\)"):
        model.decoder(jnp.ones(4))
    with pytest.raises(ValueError, match=r"xs must have shape \(window, state_dim=2\)"):
        ls.koopman_loss(model, jnp.ones((5, 3)))
    with pytest.raises(ValueError, match=r"xs must have shape \(window, state_dim=2\)"):
        ls.mlp_baseline_loss(ls.MLPBaseline(2, width=4, key=jr.key(0)), jnp.ones((5, 3)))
    with pytest.raises(ValueError, match="discretization='bogus'"):
        ls.KoopmanAutoencoder(2, 4, dynamics="mlp", discretization="bogus", key=jr.key(0))
    with pytest.raises(ValueError, match="dynamics_width=0"):
        ls.KoopmanAutoencoder(2, 4, dynamics="mlp", dynamics_width=0, key=jr.key(0))
    with pytest.raises(ValueError, match="dynamics_width=7 is the MLP dynamics' width"):
        ls.KoopmanAutoencoder(2, 4, dynamics_width=7, key=jr.key(0))
    headed = ls.KoopmanAutoencoder(2, 4, 1, width=8, action_head=True, key=jr.key(0))
    with pytest.raises(ValueError, match=r"z must have shape \(4,\), got z.shape=\(3,\)"):
        headed.predict_action(jnp.zeros(3))
    ts = jnp.linspace(0.0, 1.0, 11)
    euler = dict(solver=diffrax.Euler(), stepsize_controller=diffrax.StepTo(ts))
    assert ls.unroll_continuous(model, jnp.ones(2), ts, **euler).shape == (11, 2)
    with pytest.raises(ValueError, match="StepTo.*reencoding.*4 segments"):
        ls.unroll_continuous(model, jnp.ones(2), ts, reencode_dt=0.25, **euler)
    # The exact path solves no ODE: diffrax options would be silently ignored.
    with pytest.raises(ValueError, match="^solver, stepsize_controller have no effect with exact"):
        ls.unroll_continuous(model, jnp.ones(2), ts, exact=True, **euler)
    for option in ({"adjoint": diffrax.BacksolveAdjoint()}, {"dt0": 0.1}):
        with pytest.raises(ValueError, match=f"^{next(iter(option))} has no effect with exact"):
            ls.unroll_continuous(model, jnp.ones(2), ts, exact=True, **option)
    with pytest.raises(ValueError, match="action_latent_dim=3 needs action_dim > 0"):
        ls.KoopmanAutoencoder(2, 4, action_latent_dim=3, key=jr.key(0))
    with pytest.raises(ValueError, match="autonomous: pass v=None"):
        model.dynamics(jnp.zeros(6), jnp.zeros(1))
    with pytest.raises(ValueError, match="v must have shape \\(3,\\).*v=None"):
        controlled.dynamics(jnp.zeros(6))


def test_loss_options_are_checked(model, controlled):
    """Concrete weights must be finite and non-negative; an action weight needs an action
    head; an MLP decoder's depth needs an MLP decoder."""
    xs = jr.normal(jr.key(10), (5, 2))
    for name, bad in (("sparsity", -1.0), ("alignment", float("nan")), ("prediction", np.inf)):
        with pytest.raises(ValueError, match=f"{name} must be a finite, non-negative"):
            ls.koopman_loss(model, xs, **{name: bad})
    with pytest.raises(ValueError, match="action=0.5 weighs the action head's loss, but the"):
        ls.koopman_loss(controlled, xs, jnp.zeros((4, 1)), action=0.5)
    # The action weight is checked also when its term is absent (a head, no actions).
    headed = ls.KoopmanAutoencoder(
        2, 6, width=8, action_head=True, head_action_dim=3, key=jr.key(0)
    )
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="action must be a finite, non-negative"):
            ls.koopman_loss(headed, xs, action=bad)
    with pytest.raises(ValueError, match="decoder_layers=7 is the MLP decoder's depth"):
        ls.KoopmanAutoencoder(2, 4, decoder_layers=7, key=jr.key(0))
    deep = ls.KoopmanAutoencoder(2, 4, decoder="mlp", decoder_layers=3, width=8, key=jr.key(0))
    assert len(deep.decoder.layers) == 3


@pytest.fixture(scope="module")
def single_precision_predictions(model, controlled):
    """The float32 predictions each half-precision model is compared with (the same for
    both half dtypes: computed once)."""
    x0, us, ts = jnp.array([0.3, -0.2]), jnp.full((5, 1), 0.1), jnp.linspace(0.0, 1.0, 5)
    zoh = ls.KoopmanAutoencoder(2, 6, action_dim=1, width=8, discretization="exact", key=jr.key(1))
    discrete = [(m, ls.unroll(m, x0, us, steps=5, reencode_every=2)) for m in (controlled, zoh)]
    continuous = {
        exact: ls.unroll_continuous(model, x0, ts, reencode_dt=0.5, exact=exact)
        for exact in (False, True)
    }
    return x0, us, ts, discrete, continuous


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_models(model, single_precision_predictions, dtype):
    """Half-precision models (no half-precision solve or matrix exponential in JAX)
    discretise in float32 and integrate in float32; results come back in their dtype."""
    half = lambda tree: jax.tree.map(
        lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, tree
    )
    x0, us, ts, discrete, continuous = single_precision_predictions
    # Op by op (as written: every half-precision result is rounded, none kept in float32).
    for m, want in discrete:
        got = ls.unroll(half(m), half(x0), half(us), steps=5, reencode_every=2)
        assert got.dtype == dtype
        np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=2e-2)
    loss = eqx.filter_jit(ls.koopman_loss)(half(model), half(jr.normal(jr.key(1), (4, 2))))[0]
    assert loss.dtype == dtype
    for exact in (False, True):
        got = ls.unroll_continuous(half(model), half(x0), half(ts), reencode_dt=0.5, exact=exact)
        assert got.dtype == dtype
        np.testing.assert_allclose(np.asarray(got, np.float32), continuous[exact], atol=2e-2)


def test_loss_weights_may_be_traced(model, no_jaxtyping):
    """Weights are data (e.g. a schedule under `jit`); every term is reported. A traced
    weight is checked at run time (a negative one gave a finite loss, NaN a NaN loss)."""
    xs = jr.normal(jr.key(10), (5, 2))
    loss = eqx.filter_jit(lambda w: ls.koopman_loss(model, xs, prediction=w))
    for bad in (-5.0, math.nan):
        assert_check_fails("prediction must be a finite, non-negative", loss, jnp.asarray(bad))
    traced, terms = loss(jnp.asarray(0.5))
    expected, _ = ls.koopman_loss(model, xs, prediction=0.5)
    np.testing.assert_allclose(traced, expected, rtol=1e-6)
    _, zero_terms = ls.koopman_loss(model, xs, prediction=0.0)
    assert (
        set(zero_terms) == set(terms) == {"alignment", "reconstruction", "prediction", "sparsity"}
    )
    # NumPy scalars of any floating dtype, bfloat16's (an ml_dtypes scalar, which the
    # RealScalar hint does not name: hence no jaxtyping here) included.
    for weight in (np.float32(0.5), np.asarray([0.5], jnp.bfloat16)[0]):
        np.testing.assert_allclose(ls.koopman_loss(model, xs, prediction=weight)[0], expected)


def test_parameters_follow_x64():
    """`log_delta` takes the default float dtype like K (float64 under x64), so float64
    finite differences see it."""
    with jax.enable_x64(True):
        for cls in (ls.LinearKoopmanDynamics, ls.MLPDynamics):
            dynamics = cls(3, key=jr.key(0))
            leaves = jax.tree.leaves(eqx.filter(dynamics, eqx.is_array))
            assert {leaf.dtype for leaf in leaves} == {jnp.dtype(jnp.float64)}, cls
    # Not weakly typed either: an optimiser step returns the same types, so a jitted
    # train step compiles once.
    dynamics = ls.LinearKoopmanDynamics(3, key=jr.key(0))
    assert not dynamics.log_delta.weak_type


def test_unroll_latents_checks_without_jaxtyping(model, no_jaxtyping):
    # Integer states were converted silently, where the model and unrolls refuse them.
    baseline = ls.MLPBaseline(2, width=8, layers=2, key=jr.key(0))
    ints = jnp.array([[1, 0], [0, 1], [1, 1]], jnp.int32)
    for loss, m in ((ls.koopman_loss, model), (ls.mlp_baseline_loss, baseline)):
        with pytest.raises(TypeError, match="xs must have a real floating dtype, got .*int32"):
            loss(m, ints)
    with pytest.raises(ValueError, match="steps must be a positive integer, got steps=2.0"):
        ls.unroll_latents(model, jnp.array([0.1, 0.2]), steps=2.0)
    # The loss's own options are named by the loss (beartype's error named the
    # `unroll_latents` it calls, and printed the whole model).
    with pytest.raises(ValueError, match="reencode_every must be None or a positive integer"):
        ls.koopman_loss(model, jnp.zeros((6, 2)), reencode_every=jnp.asarray(2))
    with pytest.raises(ValueError, match="method must be one of .*got method='scan'"):
        ls.koopman_loss(model, jnp.zeros((6, 2)), method="scan")
    for dt in (True, "0.1"):
        with pytest.raises(
            ValueError, match=f"dt must be a positive, finite real number, got dt={dt!r}"
        ):
            ls.KoopmanAutoencoder(2, 4, dt=dt, key=jr.key(0))
    # A truthy string is not a flag (it built an action head), nor a string a weight.
    with pytest.raises(TypeError, match="action_head must be a bool, got action_head='no'"):
        ls.KoopmanAutoencoder(2, 4, 1, action_head="no", key=jr.key(0))
    with pytest.raises(ValueError, match="alignment must be a real number.*'1'"):
        ls.koopman_loss(model, jnp.zeros((6, 2)), alignment="1")
    # An array of weights would make the loss an array (and `jax.grad` fail far away).
    with pytest.raises(ValueError, match=r"scalar float array, got alignment=Array\(\[1., 2"):
        ls.koopman_loss(model, jnp.zeros((6, 2)), alignment=jnp.array([1.0, 2.0]))


@pytest.mark.parametrize("x64", [False, True])
def test_unroll_continuous_jit_with_later_start(x64):
    """Traced `ts` with `ts[0] != 0`: save times are clipped against the very `t0`, `t1`
    of each solve (clipped against reencoding times computed outside the scan, which
    XLA rounded differently, diffrax rejected them: "saveat.ts must lie between")."""
    with jax.enable_x64(x64):
        m = ls.KoopmanAutoencoder(2, 6, width=8, key=jr.key(0))
        x0, grid = jnp.array([0.3, -0.2]), jnp.linspace(0.0, 3.0, 31)
        run = eqx.filter_jit(
            lambda ts: ls.unroll_continuous(m, x0, ts, reencode_dt=0.2, num_segments=15)
        )
        # Autonomous dynamics: the eager prediction from ts[0] = 0 is the one at any ts[0].
        eager = ls.unroll_continuous(m, x0, grid, reencode_dt=0.2)
        for t0 in (0.1, 0.123):
            np.testing.assert_allclose(run(t0 + grid), eager, rtol=1e-4, atol=1e-5)


def test_unroll_continuous_with_controls_is_the_zero_order_hold_flow():
    """Controls held on `[ts[i], ts[i + 1])`: on the sampling grid the ODE path equals
    `unroll` with the exact (zero-order-hold) discretisation, reencoded or not, from a
    later start, eagerly and traced, and through a `ClipStepSizeController` of the
    user's (with `step_ts` of its own)."""
    with jax.enable_x64(True):
        m = ls.KoopmanAutoencoder(
            2, 6, action_dim=1, action_latent_dim=3, width=8, discretization="exact",
            key=jr.key(1),
        )  # fmt: skip
        steps, dt = 30, m.dynamics.dt
        x0, actions = jnp.array([0.3, -0.2]), jr.normal(jr.key(2), (steps, 1))
        ts = 0.5 + dt * jnp.arange(steps + 1.0)
        tight = dict(
            solver=diffrax.Dopri8(),
            stepsize_controller=diffrax.PIDController(rtol=1e-12, atol=1e-12),
        )
        expected = {}
        for k in (None, 7):
            reencode_dt = None if k is None else k * dt
            expected[k] = jnp.concatenate(
                [m(x0)[None], ls.unroll(m, x0, actions, steps=steps, reencode_every=k)]
            )
            got = ls.unroll_continuous(m, x0, ts, actions, reencode_dt=reencode_dt, **tight)
            np.testing.assert_allclose(got, expected[k], rtol=0, atol=1e-9)
        # At the default tolerances too: no step straddles a change of control (one
        # that did would leave an error of ~5e-4 here).
        default = ls.unroll_continuous(m, x0, ts, actions)
        np.testing.assert_allclose(default, expected[None], rtol=0, atol=1e-8)
        clipped = diffrax.ClipStepSizeController(
            diffrax.PIDController(rtol=1e-12, atol=1e-12), step_ts=ts[::4]
        )
        got = ls.unroll_continuous(
            m, x0, ts, actions, solver=diffrax.Dopri8(), stepsize_controller=clipped
        )
        np.testing.assert_allclose(got, expected[None], rtol=0, atol=1e-9)
        run = jax.jit(
            lambda ts, u: ls.unroll_continuous(
                m, x0, ts, u, reencode_dt=7 * dt, num_segments=5, **tight
            )
        )
        np.testing.assert_allclose(run(ts, actions), expected[7], rtol=0, atol=1e-9)
        grads = jax.grad(lambda u: ls.unroll_continuous(m, x0, ts, u, **tight).sum())(actions)
        assert np.all(np.isfinite(grads)) and np.any(grads != 0)


def test_unroll_continuous_segments_that_end_on_a_jump(model):
    """A segment the solver covers in one step and that ends on a change of control (one
    interval, reencoding at every output time, a last segment of one interval) or on a
    `jump_ts` of the user's: diffrax steps past a jump at the segment's end and never
    saved there (NaN states, or a max_steps error from the next segment)."""
    m = ls.KoopmanAutoencoder(
        2, 6, action_dim=1, action_latent_dim=3, width=8, discretization="exact",
        key=jr.key(1),
    )  # fmt: skip
    dt, x0 = m.dynamics.dt, jnp.array([0.3, -0.2])
    for steps, k in ((1, None), (3, 1), (8, 7)):
        actions = jr.normal(jr.key(steps), (steps, 1))
        ts = 0.5 + dt * jnp.arange(steps + 1.0)
        reencode_dt = None if k is None else k * dt
        got = ls.unroll_continuous(m, x0, ts, actions, reencode_dt=reencode_dt)
        want = ls.unroll(m, x0, actions, steps=steps, reencode_every=k)
        np.testing.assert_allclose(got, jnp.concatenate([m(x0)[None], want]), atol=1e-6)
    ts = 0.01 * jnp.arange(5.0)
    jumps = diffrax.ClipStepSizeController(diffrax.PIDController(rtol=1e-7, atol=1e-9), jump_ts=ts)
    got = ls.unroll_continuous(model, x0, ts, reencode_dt=0.01, stepsize_controller=jumps)
    want = ls.unroll_continuous(model, x0, ts, reencode_dt=0.01, exact=True)
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_unroll_continuous_takes_integer_times(model):
    """Integer `ts` (exact) give what the same float times give, on every path."""
    x0, ts = jnp.array([0.3, -0.2]), np.arange(4)
    for options in ({}, {"exact": True}):
        floats = ls.unroll_continuous(model, x0, ts.astype(np.float32), reencode_dt=1, **options)
        for given in (ts, jnp.asarray(ts, jnp.int32)):
            got = ls.unroll_continuous(model, x0, given, reencode_dt=1, **options)
            assert got.dtype == jnp.float32
            np.testing.assert_allclose(got, floats, rtol=1e-6, atol=1e-7)


def test_unroll_continuous_controls_far_from_zero_and_at_one_time(controlled):
    """float32 times at 1e4 with a controller of the user's that has `step_ts` of its
    own: they are shifted to each segment's time with the controls' jumps (in absolute
    times the solver's rounding to the segment's end crossed the last jump, and every
    step was rejected until max_steps). One output time needs no control."""
    ts = np.float32(1e4) + np.float32(0.05) * np.arange(21, dtype=np.float32)
    actions = jr.normal(jr.key(4), (20, 1))
    x0 = jnp.array([0.2, -0.1])
    pid = diffrax.PIDController(rtol=1e-6, atol=1e-8)
    clipped = diffrax.ClipStepSizeController(pid, step_ts=jnp.asarray(ts[::4]))
    far = ls.unroll_continuous(controlled, x0, ts, actions, stepsize_controller=clipped)
    near = ls.unroll_continuous(controlled, x0, ts - ts[0], actions, stepsize_controller=pid)
    np.testing.assert_allclose(far, near, rtol=1e-5, atol=1e-6)
    one = ls.unroll_continuous(controlled, x0, ts[:1], jnp.zeros((0, 1)))
    np.testing.assert_allclose(one, controlled(x0)[None], rtol=1e-6)


def test_unroll_continuous_controlled_mlp_dynamics_between_irregular_times(controlled):
    """MLP dynamics, irregular `ts`: one solve per interval with its control (the test's
    loop) is what the controlled path computes."""
    m = ls.KoopmanAutoencoder(
        2, 6, action_dim=1, action_latent_dim=3, dynamics="mlp", decoder="mlp", width=8,
        key=jr.key(3),
    )  # fmt: skip
    ts, x0 = jnp.array([0.0, 0.013, 0.05, 0.051, 0.2]), jnp.array([0.4, 0.1])
    actions = jnp.array([[1.0], [-2.0], [0.5], [3.0]])
    field = lambda t, z, v: m.dynamics.vector_field(z, v)
    z, expected = m.encode(x0), [m.decode(m.encode(x0))]
    for i in range(4):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(field), diffrax.Dopri8(), ts[i], ts[i + 1], 1e-3, z,
            args=m.encode_action(actions[i]),
            stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8),
        )  # fmt: skip
        z = sol.ys[-1]
        expected.append(m.decode(z))
    got = ls.unroll_continuous(
        m, x0, ts, actions, solver=diffrax.Dopri8(),
        stepsize_controller=diffrax.PIDController(rtol=1e-8, atol=1e-8),
    )  # fmt: skip
    np.testing.assert_allclose(got, jnp.stack(expected), rtol=1e-5, atol=1e-6)
    # Bad input: the controls' shape, presence and the options that cannot honour them.
    x0, ts = jnp.array([0.1, 0.2]), jnp.linspace(0.0, 0.1, 5)
    wrong = r"actions has shape \(3, 1\), expected \(len\(ts\) - 1, action_dim\) = \(4, 1\)"
    with pytest.raises(ValueError, match=wrong):
        ls.unroll_continuous(controlled, x0, ts, jnp.zeros((3, 1)))
    with pytest.raises(ValueError, match="action_dim=1: actions are required"):
        ls.unroll_continuous(controlled, x0, ts)
    with pytest.raises(ValueError, match="action_dim=0 .*pass actions=None"):
        ls.unroll_continuous(m.__class__(2, 6, width=8, key=jr.key(0)), x0, ts, jnp.zeros((4, 1)))
    with pytest.raises(ValueError, match="actions contains NaN"):
        ls.unroll_continuous(controlled, x0, ts, jnp.full((4, 1), jnp.nan))
    with pytest.raises(ValueError, match="exact=True is for autonomous models"):
        ls.unroll_continuous(controlled, x0, ts, jnp.zeros((4, 1)), exact=True)
    with pytest.raises(ValueError, match=r"ConstantStepSize\(\) cannot be used with actions"):
        ls.unroll_continuous(
            controlled, x0, ts, jnp.zeros((4, 1)), solver=diffrax.Heun(),
            stepsize_controller=diffrax.ConstantStepSize(),
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"Euler\(\) has no error estimate"):
        ls.unroll_continuous(controlled, x0, ts, jnp.zeros((4, 1)), solver=diffrax.Euler())


def test_time_just_past_a_reencoding_time_is_reencoded(model):
    """`ts[1] = 1.0` equals the reencoding time: decoded before reencoding; `ts[2]` is
    5e-5 later (hundreds of float32 ulps): reencoded first, on every path. (A tolerance
    of 1e-4 segments counted it as equal.)"""
    x0, ts = jnp.array([0.5, -0.4]), jnp.array([0.0, 1.0, 1.00005])
    G = model.dynamics.generator()
    x1 = model.decode(jsl.expm(G) @ model.encode(x0))
    x2 = model.decode(jsl.expm((ts[2] - ts[1]) * G) @ model.encode(x1))
    expected = jnp.stack([model(x0), x1, x2])

    @jax.jit
    def predictions(traced_ts):
        # Closed-over (concrete) times take the host path; an argument is traced.
        return (
            ls.unroll_continuous(model, x0, ts, reencode_dt=1.0, exact=True),
            ls.unroll_continuous(model, x0, ts, reencode_dt=1.0),
            ls.unroll_continuous(model, x0, traced_ts, reencode_dt=1.0, num_segments=2),
        )

    for got in predictions(ts):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_float64_times_with_a_float32_reencoding_interval(model):
    """float64 times and a float32 `reencode_dt` (as from float32 data) give the 10
    segments they mean, not an 11th of 1.7e-7; a Python float is exact (it is 11)."""
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):  # float32 model
        x0, ts = jnp.array([0.5, -0.4]), jnp.asarray(0.1 * np.arange(71))
        reencode_dt = np.float32(0.7)  # 0.69999998808
        out = ls.unroll_continuous(
            model, x0, ts, reencode_dt=reencode_dt, num_segments=10, exact=True
        )
        with pytest.raises(ValueError, match="= 11 segments"):
            ls.unroll_continuous(
                model, x0, ts, reencode_dt=float(reencode_dt), num_segments=10, exact=True
            )
    assert out.shape == (71, 2) and bool(jnp.isfinite(out).all())
    # Far from 0 float64 times keep their own (small) rounding: 10 segments, not 9, and
    # the same unroll as from 0 (the model is autonomous).
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        x0, offsets = jnp.array([0.5, -0.4]), 0.005 * np.arange(21)
        far, near = jnp.asarray(1e4 + offsets), jnp.asarray(offsets)

        @eqx.filter_jit
        def both(model, x0):
            # One compilation; the times closed over are concrete (the host path).
            run = lambda t: ls.unroll_continuous(
                model, x0, t, reencode_dt=0.01, num_segments=10, exact=True
            )
            return run(far), run(near)

        np.testing.assert_allclose(*both(model, x0), atol=1e-5)


def test_numpy_sizes_become_ints():
    """NumPy integers are taken as ints (static fields must hold Python values); the
    annotations let them through."""
    n = np.int64
    m = ls.KoopmanAutoencoder(n(2), n(4), n(1), width=n(8), key=jr.key(0))
    sizes = (m.state_dim, m.latent_dim, m.action_dim, m.dynamics.latent_dim)
    assert all(type(size) is int for size in sizes), sizes
    base = ls.MLPBaseline(n(2), n(1), width=n(4), layers=n(2), key=jr.key(0))
    assert type(base.state_dim) is int and type(base.action_dim) is int


def test_dynamics_and_models_check_their_arguments(model, controlled, mlp_dynamics):
    """`vector_field` (what diffrax calls), `step` and `rate` check `z` and `v` like
    `__call__` (a controlled `rate` without `v` dropped the control); the baseline and
    the action encoder check shapes; constructors reject bad sizes."""
    z = jnp.zeros(6)
    dynamics = controlled.dynamics
    for f in (dynamics.vector_field, dynamics.step, dynamics, dynamics.rate):
        with pytest.raises(ValueError, match=r"v must have shape \(3,\).*got v=None"):
            f(z)
    with pytest.raises(ValueError, match="autonomous: pass v=None"):
        mlp_dynamics.dynamics.vector_field(z, jnp.zeros(1))
    with pytest.raises(ValueError, match=r"z must have shape \(6,\), got z.shape=\(4,\)"):
        model.dynamics.vector_field(jnp.zeros(4))
    with pytest.raises(ValueError, match=r"u must have shape \(1,\), got u.shape=\(2,\)"):
        controlled.encode_action(jnp.zeros(2))
    base = ls.MLPBaseline(2, 1, width=4, layers=2, key=jr.key(0))
    with pytest.raises(ValueError, match=r"u must have shape \(1,\).*got u=None"):
        base(jnp.zeros(2))
    with pytest.raises(ValueError, match=r"x must have shape \(2,\), got x.shape=\(3,\)"):
        base(jnp.zeros(3), jnp.zeros(1))
    with pytest.raises(ValueError, match="autonomous: pass u=None"):
        ls.MLPBaseline(2, width=4, key=jr.key(0))(jnp.zeros(2), jnp.zeros(1))
    for width in (0, -3):
        with pytest.raises(
            ValueError, match=f"width must be a positive integer, got width={width}$"
        ):
            ls.MLPBaseline(2, width=width, key=jr.key(0))
    with pytest.raises(ValueError, match="discretization='exact' applies to linear dynamics"):
        ls.KoopmanAutoencoder(2, 4, dynamics="mlp", discretization="exact", key=jr.key(0))
    with pytest.raises(ValueError, match="dt must be a positive, finite real number, got dt=inf"):
        ls.KoopmanAutoencoder(2, 4, dt=float("inf"), key=jr.key(0))
    with pytest.raises(ValueError, match="got latent_dim=True"):
        ls.KoopmanAutoencoder(2, True, key=jr.key(0))


def test_nan_checks_name_the_argument(model, controlled):
    x0 = jnp.array([0.1, 0.2])
    # Traced actions are checked at run time, like x0.
    driven = eqx.filter_jit(lambda u: ls.unroll(controlled, x0, u, steps=3))
    assert_check_fails("actions contains NaN or inf values", driven, jnp.full((3, 1), jnp.nan))
    xs = jnp.zeros((5, 2)).at[0, 1].set(jnp.nan)
    with pytest.raises(ValueError, match=r"xs contains NaN .*\(1 of 10; the first is xs\[0, 1\]"):
        ls.koopman_loss(model, xs)
    loss = eqx.filter_jit(lambda xs: ls.koopman_loss(model, xs))
    assert_check_fails("xs contains NaN or inf values", loss, xs)


def _flow(model, t, z):
    """`psi(exp(t G) z)`: the exact flow from a latent, decoded."""
    return model.decode(jsl.expm(t * model.dynamics.generator()) @ z)


def _all_paths(model, x0, ts, reencode_dt, num_segments, **options):
    """The exact and the ODE (`options`) predictions at concrete and at traced `ts`, in
    one compilation: `ts` closed over is concrete, as outside `jit` (the host path)."""

    @eqx.filter_jit
    def all_paths(model, x0, traced_ts):
        run = lambda ts, **kw: ls.unroll_continuous(model, x0, ts, reencode_dt=reencode_dt, **kw)
        concrete = [run(ts, exact=True), run(ts, **options)]
        kws = ({"exact": True}, options)
        return concrete + [run(traced_ts, num_segments=num_segments, **kw) for kw in kws]

    return all_paths(model, x0, ts)


def test_float64_times_near_a_reencoding_time():
    """float64 times: with a Python float `reencode_dt` (exact) a time 2e-6 past the
    reencoding time is reencoded first; with a float32 one a time within 16 float32
    units of its distance from ts[0] past it counts as the reencoding time, and is evaluated at its
    own offset on every path. (The float32 term applied to every `reencode_dt`, so the
    first time was not reencoded; the ODE path evaluated the second at the
    reencoding time.)"""
    with jax.enable_x64(True):
        m = ls.KoopmanAutoencoder(2, 4, width=8, key=jr.key(0))
        a = jr.normal(jr.key(1), (4, 4))
        m = eqx.tree_at(lambda m: m.dynamics.K, m, 0.5 * (a - a.T))  # a rotation
        x0 = jnp.array([0.5, -0.4])
        tight = {"stepsize_controller": diffrax.PIDController(rtol=1e-10, atol=1e-12)}
        ts = jnp.array([0.0, 1.0, 1.000002, 2.0])
        x1 = _flow(m, 1.0, m.encode(x0))
        x2 = _flow(m, 2e-6, m.encode(x1))
        for got in _all_paths(m, x0, ts, 1.0, 2, **tight):
            np.testing.assert_allclose(got[1:3], jnp.stack([x1, x2]), rtol=1e-7, atol=1e-9)

        reencode_dt = np.float32(1.1)  # 1.1000000238
        ts = jnp.array([0.0, float(reencode_dt) + 1.5e-6, 2.2])  # 16 units of 1.1: 2.1e-6
        own = _flow(m, ts[1], m.encode(x0))
        at_reencoding_time = _flow(m, float(reencode_dt), m.encode(x0))
        assert not np.allclose(own, at_reencoding_time, rtol=0, atol=1e-7)
        for got in _all_paths(m, x0, ts, reencode_dt, 2, **tight):
            np.testing.assert_allclose(got[1], own, rtol=1e-8, atol=1e-9)


def test_exact_flow_at_irregular_times(model):
    """Irregular concrete times (as many distinct offsets as times, many segments) take
    one flow per time instead of the (offsets, segments) table, which grew as
    times x segments (1.3 GB at 3,000 times); both equal the traced path's."""
    x0 = jnp.array([0.3, -0.2])
    ts = np.sort(np.random.default_rng(0).uniform(0.0, 3.0, 60)).astype(np.float32)
    ts[0] = 0.0
    for reencode_dt in (0.05, 1.0):  # 60 segments (per time), 3 (the table)
        num = int(np.ceil(ts[-1] / reencode_dt))
        concrete = ls.unroll_continuous(model, x0, ts, reencode_dt=reencode_dt, exact=True)
        traced = jax.jit(
            lambda t, r=reencode_dt, n=num: ls.unroll_continuous(
                model, x0, t, reencode_dt=r, num_segments=n, exact=True
            )
        )(jnp.asarray(ts))
        np.testing.assert_allclose(concrete, traced, rtol=1e-5, atol=1e-6)


def test_a_late_output_time_does_not_move_early_reencodings():
    """The rounding tolerance is each time's own: one output time at 6,000 (float32)
    widened every time's to 0.23 segments, so the early ones were merged with the
    reencoding times after them (outputs off by ~0.5)."""
    m = ls.KoopmanAutoencoder(2, 8, width=16, dt=0.01, discretization="exact", key=jr.key(0))
    K = m.dynamics.K
    m = eqx.tree_at(lambda m: m.dynamics.K, m, 20 * (K - K.T) - 2 * jnp.eye(8))
    x0 = jnp.array([0.5, -0.3])
    near = np.float32(0.01) * np.arange(21, dtype=np.float32)
    far = np.concatenate([near, np.float32([6000.0])])
    discrete = ls.unroll(m, x0, steps=20, reencode_every=5)
    for ts in (near, far):
        got = ls.unroll_continuous(m, x0, ts, reencode_dt=0.05, exact=True)
        np.testing.assert_allclose(got[1:21], discrete, rtol=1e-4, atol=1e-5)


def test_float32_reencode_dt_widens_the_tolerance(model):
    """float32 times: a time 2.8e-6 past the reencoding time 1 is within 16 float32
    units of its own rounding plus 16 of its distance from ts[0] (3.8e-6), but not of
    its rounding alone (1.9e-6): reencoded for a Python float `reencode_dt`, the
    reencoding time itself for a float32 one. (The tolerance is the time's own: a
    later time, here 2, does not widen it.)"""
    x0, ts = jnp.array([0.5, -0.4]), jnp.array([0.0, 1.0000028, 2.0])
    z0 = model.encode(x0)
    reencoded = _flow(model, ts[1] - 1.0, model.encode(_flow(model, 1.0, z0)))
    not_reencoded = _flow(model, ts[1], z0)
    assert not np.allclose(reencoded, not_reencoded, atol=1e-3)
    for reencode_dt, expected in [(1.0, reencoded), (np.float32(1.0), not_reencoded)]:
        for got in _all_paths(model, x0, ts, reencode_dt, 2):
            np.testing.assert_allclose(got[1], expected, rtol=1e-4, atol=1e-5)


def test_times_keep_the_rounding_of_their_own_dtype():
    """float32 times given to a float64 model (x64) are known only to float32's rounding:
    a grid time that rounded up past a reencoding time is that time, decoded before
    reencoding as by `unroll` (it took float64's tolerance, and was reencoded first:
    outputs off by 8% of the state). A concrete num_segments may exceed the count (the
    documented formula gives 4 for 0.1 * arange(4), whose span is 3 segments)."""
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        model = ls.KoopmanAutoencoder(2, 6, width=8, dt=0.1, discretization="exact", key=jr.key(0))
        model = jax.tree.map(
            lambda a: a.astype(jnp.float64) if eqx.is_inexact_array(a) else a, model
        )
        x0 = jnp.array([0.5, -0.4])
        discrete = ls.unroll(model, x0, steps=10, reencode_every=1)
        ts = np.float32(0.1) * np.arange(11, dtype=np.float32)  # some round up, some down
        assert np.any(ts.astype(np.float64) > 0.1 * np.arange(11))
        for exact in (True, False):
            got = ls.unroll_continuous(model, x0, ts, reencode_dt=0.1, exact=exact)
            np.testing.assert_allclose(got[1:], discrete, atol=1e-6)
        grid = 0.1 * np.arange(4)
        # float16 times of a float16 model (integrated in float32) likewise.
        half = jax.tree.map(
            lambda a: a.astype(jnp.float16) if eqx.is_inexact_array(a) else a, model
        )
        ts16 = jnp.asarray(0.1 * np.arange(11), jnp.float16)
        got = ls.unroll_continuous(half, x0.astype(jnp.float16), ts16, reencode_dt=0.1, exact=True)
        np.testing.assert_allclose(np.asarray(got[1:], np.float64), discrete, atol=1e-3)
        # Weakly typed times take the half model's dtype, and its rounding: 0.3 is
        # 0.30005 in float16 (it took float32's tolerance, reencoded first: off by 0.01).
        weak = 0.1 * jnp.arange(11)
        assert weak.weak_type
        np.testing.assert_array_equal(
            ls.unroll_continuous(half, x0.astype(jnp.float16), weak, reencode_dt=0.1, exact=True),
            got,
        )
        four = ls.unroll_continuous(model, x0, grid, reencode_dt=0.1, num_segments=4, exact=True)
        np.testing.assert_array_equal(
            four, ls.unroll_continuous(model, x0, grid, reencode_dt=0.1, exact=True)
        )


def test_unroll_continuous_far_from_zero_and_whole_euler_segments(model):
    """Float32 times near 1e6 left the solver no room to step (it failed after max_steps,
    though the latent ODE does not depend on time), and a reencoding interval they cannot
    resolve is an error; a segment that dt0 divides only up
    to rounding (0.2 / 0.05 = 4.000000000000001) took a fifth Euler step."""
    x0 = jnp.array([0.3, -0.2])
    ts = jnp.float32(1e6) + jnp.linspace(0.5, 16.5, 17)  # float32 spacing there: 0.0625
    for reencode_dt in (None, 8.0):
        ode = ls.unroll_continuous(model, x0, ts, reencode_dt=reencode_dt)
        exact = ls.unroll_continuous(model, x0, ts, reencode_dt=reencode_dt, exact=True)
        np.testing.assert_allclose(ode, exact, rtol=1e-5, atol=1e-6)
    # Reencoding every 0.25 there is below the times' rounding (16 units: 1.9): refused
    # (it counted one segment, no reencoding at all), under jit too; relative to ts[0] it
    # runs, and so do times that span no reencoding time.
    message = "reencode_dt=0.25 cannot place the reencoding times among the output times"
    far = message + ": float32 times are known only .*wider dtype.*, or ts - ts\\[0\\]"
    with pytest.raises(ValueError, match=far):
        ls.unroll_continuous(model, x0, ts, reencode_dt=0.25, exact=True)
    # bfloat16 times from 0 to 1 round too coarsely for 0.25: a wider dtype is the cure, not
    # a shift (they start at 0).
    half = jax.tree.map(lambda a: a.astype(jnp.bfloat16) if eqx.is_inexact_array(a) else a, model)
    bf16_ts, bf16_x0 = jnp.linspace(0, 1, 5, dtype=jnp.bfloat16), x0.astype(jnp.bfloat16)
    with pytest.raises(ValueError, match=r"bfloat16 times .*jax_enable_x64\) \(ts from 0 to 1\)"):
        ls.unroll_continuous(half, bf16_x0, bf16_ts, reencode_dt=0.25)
    traced = jax.jit(
        lambda t: ls.unroll_continuous(model, x0, t, reencode_dt=0.25, num_segments=64)
    )
    assert_check_fails(message, traced, ts)
    assert traced(ts - ts[0]).shape == (17, 2)
    for short in (ts[:1], ts[0] + jnp.array([0.0, 0.125])):  # one time; two, 0.125 apart
        assert ls.unroll_continuous(model, x0, short, reencode_dt=0.25).shape == (len(short), 2)
    # A float32 reencode_dt over 1e6 intervals (float64 times): its own precision is the
    # cause, and a Python float the cure.
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        long = jnp.asarray([0.0, 1e4])
        with pytest.raises(ValueError, match="a float32 reencode_dt summed over .* Python float"):
            ls.unroll_continuous(model, x0, long, reencode_dt=np.float32(0.01), exact=True)
        assert ls.unroll_continuous(model, x0, long, reencode_dt=0.01, exact=True).shape == (2, 2)
    with jax.enable_x64(True):
        mlp = ls.KoopmanAutoencoder(2, 6, dynamics="mlp", width=8, dt=0.05, key=jr.key(3))
        x0 = x0.astype(jnp.float64)
        times = 0.05 * jnp.arange(13.0)
        euler = ls.unroll_continuous(mlp, x0, times, reencode_dt=0.2, solver=diffrax.Euler())
        discrete = ls.unroll(mlp, x0, steps=12, reencode_every=4)
        np.testing.assert_allclose(euler[1:], discrete, rtol=1e-13, atol=1e-15)


def test_unroll_continuous_fixed_step_solver(mlp_dynamics):
    """A solver without an error estimate (Euler) takes fixed steps of the sampling
    interval by default, which for MLP dynamics are the discrete unroll's steps (diffrax
    refused: "Cannot use adaptive step sizes")."""
    x0, ts = jnp.array([0.5, -0.4]), 0.01 * jnp.arange(11.0)

    @eqx.filter_jit
    def predictions(model, x0):
        # One compilation; `ts` closed over is concrete, as outside `jit` (the host path).
        run = lambda **kw: ls.unroll_continuous(model, x0, ts, solver=diffrax.Euler(), **kw)
        return dict(
            reencoded=run(reencode_dt=0.05),
            discrete_reencoded=ls.unroll(model, x0, steps=10, reencode_every=5),
            euler=run(),
            discrete=ls.unroll(model, x0, steps=10),
            constant=run(stepsize_controller=diffrax.ConstantStepSize()),
            ode=ls.unroll_continuous(model, x0, ts),
            fine=run(dt0=0.0025),
        )

    p = predictions(mlp_dynamics, x0)
    np.testing.assert_allclose(p["reencoded"][1:], p["discrete_reencoded"], rtol=1e-5, atol=1e-6)
    # Without reencoding too; an explicit constant step size without dt0 takes the same
    # steps, and dt0 sets them: 4 Euler steps per interval are closer to the ODE.
    euler, ode = p["euler"], p["ode"]
    np.testing.assert_allclose(euler[1:], p["discrete"], rtol=1e-5)
    np.testing.assert_array_equal(p["constant"], euler)
    assert jnp.max(jnp.abs(p["fine"] - ode)) < 0.5 * jnp.max(jnp.abs(euler - ode))


def test_numpy_inputs(model, controlled):
    """NumPy arrays, NumPy integers and NumPy / JAX real scalars pass the annotations
    and give the results of their JAX / Python counterparts."""
    x0, n = np.array([0.3, -0.2], np.float32), np.int64
    us = np.linspace(-1.0, 1.0, 6, dtype=np.float32)[:, None]
    np.testing.assert_allclose(
        ls.unroll(controlled, x0, us, steps=n(6), reencode_every=n(2)),
        ls.unroll(controlled, jnp.asarray(x0), jnp.asarray(us), steps=6, reencode_every=2),
    )
    ts = np.linspace(0.0, 0.1, 5, dtype=np.float32)
    expected = ls.unroll_continuous(
        model, jnp.asarray(x0), jnp.asarray(ts), reencode_dt=0.05, exact=True
    )
    for reencode_dt in (np.float32(0.05), jnp.float32(0.05), np.float64(0.05)):
        got = ls.unroll_continuous(
            model, x0, ts, reencode_dt=reencode_dt, num_segments=n(2), exact=True
        )
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    xs = np.asarray(jr.normal(jr.key(10), (7, 2)))
    np.testing.assert_allclose(
        ls.koopman_loss(controlled, xs, us, reencode_every=n(3))[0],
        ls.koopman_loss(controlled, jnp.asarray(xs), jnp.asarray(us), reencode_every=3)[0],
    )
    base = ls.MLPBaseline(2, width=4, key=jr.key(0))
    np.testing.assert_allclose(
        ls.mlp_baseline_loss(base, xs)[0], ls.mlp_baseline_loss(base, jnp.asarray(xs))[0]
    )
    # Weights: Python ints and NumPy numbers are weights too; a bool is not.
    loss = lambda **w: ls.koopman_loss(controlled, xs, us, **w)[0]
    np.testing.assert_allclose(
        loss(prediction=1, sparsity=np.float32(0.5)), loss(prediction=1.0, sparsity=0.5)
    )
    with pytest.raises(ValueError, match="prediction must be a real number or a scalar float"):
        loss(prediction=True)


def test_scalar_arguments_are_checked(model):
    """Bools are not numbers; steps, step sizes and scales are checked, not passed on
    to diffrax (which failed inside its callbacks) or into the parameters."""
    x0, ts = jnp.array([0.1, 0.2]), jnp.linspace(0.0, 0.1, 5)
    with pytest.raises(ValueError, match="reencode_dt must be a positive, finite real number"):
        ls.unroll_continuous(model, x0, ts, reencode_dt=True)
    with pytest.raises(ValueError, match="got dt0=-0.1"):
        ls.unroll_continuous(model, x0, ts, dt0=-0.1)
    with pytest.raises(ValueError, match="max_steps must be None or a positive integer"):
        ls.unroll_continuous(model, x0, ts, max_steps=0)
    with pytest.raises(ValueError, match="got max_steps=True"):
        ls.unroll_continuous(model, x0, ts, max_steps=True)
    # NumPy scalars as given (closed over), both predictions in one compilation.
    solved, exact = jax.jit(
        lambda: [
            ls.unroll_continuous(model, x0, ts, max_steps=np.int64(100), dt0=np.float32(1e-3)),
            ls.unroll_continuous(model, x0, ts, exact=True),
        ]
    )()
    np.testing.assert_allclose(solved, exact, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="got reencode_every=np.int64\\(0\\)"):
        ls.unroll(model, x0, steps=3, reencode_every=np.int64(0))
    with pytest.raises(ValueError, match="known when tracing"):
        jax.jit(lambda r: ls.unroll_continuous(model, x0, ts, reencode_dt=r))(0.05)
    with pytest.raises(ValueError, match="init_scale must be a finite, non-negative real"):
        ls.LinearKoopmanDynamics(4, init_scale=float("nan"), key=jr.key(0))
    dynamics = ls.LinearKoopmanDynamics(4, dt=np.float32(0.1), init_scale=0, key=jr.key(0))
    assert type(dynamics.dt) is float and not jnp.any(dynamics.K)
    # An ensemble over init_scale under filter_vmap (traced: each entry checked).
    make = lambda s: ls.LinearKoopmanDynamics(4, init_scale=s, key=jr.key(0))
    with pytest.raises(ValueError, match="init_scale must be a finite, non-negative"):
        eqx.filter_vmap(make)(jnp.array([0.0, jnp.nan]))
    ensemble = eqx.filter_vmap(make)(jnp.array([0.0, 2.0]))
    np.testing.assert_allclose(ensemble.K[1], make(2.0).K, rtol=1e-6)
    assert not jnp.any(ensemble.K[0])


def test_models_are_type_checked_without_jaxtyping(model, no_jaxtyping):
    """The library's own check: each function names the model it needs."""
    base = ls.MLPBaseline(2, width=4, key=jr.key(0))
    xs = jnp.zeros((3, 2))
    with pytest.raises(TypeError, match="model must be an instance of KoopmanAutoencoder, got"):
        ls.koopman_loss(base, xs)
    with pytest.raises(TypeError, match="model must be an instance of MLPBaseline, got"):
        ls.mlp_baseline_loss(model, xs)
    with pytest.raises(TypeError, match="model must be an instance of KoopmanAutoencoder"):
        ls.unroll_continuous(base, xs[0], jnp.linspace(0.0, 1.0, 3))
    with pytest.raises(TypeError, match="KoopmanAutoencoder or MLPBaseline, got"):
        ls.unroll(model.dynamics, xs[0], steps=2)
    with pytest.raises(ValueError, match="dt must be a positive, finite real number"):
        ls.simulate(ls.Duffing(), xs[0], 3, dt=True)


def test_float32_model_with_float64_inputs_promotes(model, controlled):
    """NumPy's float64 times, actions or windows with a float32 model and float32 states
    compute in float64 (JAX's promotion, as Equinox's layers do) instead of failing in a
    scan whose carry changed dtype; under strict promotion the error names both dtypes."""
    x32 = jnp.array([0.3, -0.2], jnp.float32)
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        ts = np.linspace(0.0, 1.0, 11)
        for exact in (False, True):
            out = ls.unroll_continuous(model, x32, ts, reencode_dt=0.25, exact=exact)
            want = ls.unroll_continuous(
                model, x32.astype(jnp.float64), ts, reencode_dt=0.25, exact=exact
            )
            assert out.dtype == jnp.float64
            np.testing.assert_array_equal(out, want)
        actions = np.zeros((5, 1))

        @jax.jit
        def discrete():
            # In one compilation; the NumPy arrays are closed over, so the functions get
            # them as given (concrete, NumPy), as outside `jit`.
            run = lambda method: ls.unroll(controlled, x32, actions, steps=5, method=method)
            loss, _ = ls.koopman_loss(controlled, np.zeros((6, 2), np.float32), actions)
            return [run("parallel"), run("sequential")], loss

        outs, loss = discrete()
        for out in outs:
            assert out.dtype == jnp.float64 and bool(jnp.isfinite(out).all())
        assert bool(jnp.isfinite(loss))
    with jax.enable_x64(True), pytest.raises(Exception, match="float32.*float64|float64.*float32"):
        ls.unroll(controlled, x32, np.zeros((5, 1)), steps=5)


def test_unroll_continuous_options_are_checked_without_jaxtyping(model, no_jaxtyping):
    """`exact` and `throw` are bools and the diffrax options instances of their classes,
    checked by the function itself (a truthy string took the exact path; a string solver
    failed inside diffrax, by an attribute the error did not name)."""
    x0, ts = jnp.array([0.1, 0.2]), jnp.linspace(0.0, 0.1, 3)
    for name in ("exact", "throw"):
        with pytest.raises(TypeError, match=f"{name} must be a bool, got {name}='no'"):
            ls.unroll_continuous(model, x0, ts, **{name: "no"})
    # A batch of time grids ("object too deep" from NumPy before).
    with pytest.raises(ValueError, match=r"ts must have shape \(times,\), got ts.shape=\(1, 3\)"):
        ls.unroll_continuous(model, x0, ts[None])
    for name, cls in [
        ("solver", "AbstractSolver"),
        ("stepsize_controller", "AbstractStepSizeController"),
        ("adjoint", "AbstractAdjoint"),
        ("progress_meter", "AbstractProgressMeter"),
    ]:
        expected = f"^{name} must be None or an instance of diffrax.{cls}, got {name}='tsit5'"
        with pytest.raises(TypeError, match=expected):
            ls.unroll_continuous(model, x0, ts, **{name: "tsit5"})


def test_unroll_continuous_refuses_multi_term_solvers(model):
    """IMEX, SDE and split solvers need several terms: refused by name (diffrax's
    "Terms are not compatible with solver!" named neither the argument nor a fix)."""
    x0, ts = jnp.array([0.1, 0.2]), jnp.linspace(0.0, 0.1, 3)
    for solver in (diffrax.KenCarp4(), diffrax.SemiImplicitEuler(), diffrax.SRA1()):
        name = type(solver).__name__
        with pytest.raises(ValueError, match=rf"^solver={name}\(\) needs several terms"):
            ls.unroll_continuous(model, x0, ts, solver=solver)


def test_unroll_continuous_implicit_solver_in_float32():
    """The implicit solver the docstring suggests, with the root finder it recommends for
    float32, agrees with the exact path (on a model where diffrax's default VeryChord
    rejected steps until max_steps)."""
    import optimistix as optx

    model = ls.KoopmanAutoencoder(2, 4, width=8, encoder_layers=2, dt=0.1, key=jr.key(1))
    x0, ts = jnp.array([0.3, -0.2]), jnp.linspace(0.0, 2.0, 11)
    solver = diffrax.Kvaerno5(root_finder=optx.Chord(rtol=1e-5, atol=1e-6))
    got = ls.unroll_continuous(model, x0, ts, reencode_dt=0.5, solver=solver)
    want = ls.unroll_continuous(model, x0, ts, reencode_dt=0.5, exact=True)
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_unroll_continuous_traced_dt0(model):
    """`dt0` may be traced, as in diffrax (e.g. `vmap` over step sizes for a convergence
    study; it was refused as "not known when tracing"), and is checked at run time."""
    x0, ts = jnp.array([0.3, -0.2]), jnp.linspace(0.0, 0.1, 3)
    run = lambda h: ls.unroll_continuous(model, x0, ts, solver=diffrax.Euler(), dt0=h)
    steps = jnp.array([0.05, 0.01])
    batched = jax.vmap(run)(steps)
    # Each step size as a Python float (concrete), the pair in one compilation.
    concrete = jax.jit(lambda: [run(h) for h in (0.05, 0.01)])()
    for got, want in zip(batched, concrete, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert not np.allclose(batched[0], batched[1], rtol=0, atol=1e-7)
    assert_check_fails("dt0 must be a positive, finite real number", jax.jit(run), -0.01)


def test_unroll_continuous_throw_false(model):
    """`throw=False`, as in diffrax: a failed solve (here `max_steps` reached) raises no
    error; the states from the failure on are NaN, after reencoding too."""
    x0, ts = jnp.array([0.3, -0.2]), jnp.linspace(0.0, 0.1, 5)
    run = lambda **kw: ls.unroll_continuous(model, x0, ts, reencode_dt=0.05, max_steps=1, **kw)
    with pytest.raises(Exception, match=r"the ODE solve reached max_steps=1 in a segment"):
        run()
    out = run(throw=False)
    assert out.shape == (5, 2) and bool(jnp.all(jnp.isfinite(out[0])))
    assert bool(jnp.all(jnp.isnan(out[2:])))


def test_unroll_continuous_names_a_cast_that_merges_times(model):
    """float64 times that float32 (the model's dtype, without x64) cannot tell apart:
    the error names the cast, since the times given were strictly increasing."""
    x0, ts = jnp.array([0.3, -0.2]), 1e8 + np.array([0.0, 0.5, 1.0])
    with pytest.raises(ValueError, match="strictly increasing.*given in float64, is computed in"):
        ls.unroll_continuous(model, x0, ts)


def test_half_precision_keeps_the_precision_of_reencode_dt(model):
    """A half-precision model counts segments as its float32 counterpart does: a float32
    `reencode_dt` widens the tolerance there too (the float32 call dropped its precision,
    found 3 segments, and refused num_segments=2)."""
    half = jax.tree.map(lambda a: a.astype("bfloat16") if eqx.is_inexact_array(a) else a, model)
    x0, ts = jnp.array([0.5, -0.4]), jnp.array([0.0, 1.0, 2.0])
    reencode_dt = np.float32(0.9999971)  # 2 / reencode_dt is 5.8e-6 past 2: within 16 ulps
    run = lambda m, x0, ts: ls.unroll_continuous(
        m, x0, ts, reencode_dt=reencode_dt, num_segments=2, exact=True
    )
    got = run(half, x0.astype("bfloat16"), ts.astype("bfloat16"))
    np.testing.assert_allclose(np.asarray(got, np.float32), run(model, x0, ts), atol=2e-2)


def test_half_precision_times_closed_over_under_jit_are_concrete(model):
    """Times closed over in `jit` are concrete for a half-precision model too, as for a
    float32 one: no `num_segments` needed (the float32 cast of the times, traced, was
    passed on, and the call asked for num_segments)."""
    half = jax.tree.map(lambda a: a.astype("bfloat16") if eqx.is_inexact_array(a) else a, model)
    x0 = jnp.array([0.5, -0.4], jnp.bfloat16)
    ts = jnp.linspace(0, 0.05, 6, dtype=jnp.bfloat16)
    run = lambda: ls.unroll_continuous(half, x0, ts, reencode_dt=0.02, exact=True)
    got = eqx.filter_jit(run)()
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(got, run())


def _dot_precisions(jaxpr) -> list:
    """The `precision` of every `dot_general` in a jaxpr, its sub-jaxprs included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(eqn.params["precision"])
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found.extend(_dot_precisions(sub))
    return found


@pytest.mark.parametrize("discretization", ["bilinear", "exact"])
def test_latent_products_run_at_highest_precision(discretization):
    """XLA:GPU multiplies float32 in TF32 by default, an error that 1000 steps of the
    latent recurrence compound (2.8e-3 on an H200): every product of the linear latent
    path (powers, steps, exponentials, the unit-norm decoder) asks for HIGHEST. With an
    identity encoder the encoder adds no products of its own."""

    def build(action_dim):
        model = ls.KoopmanAutoencoder(
            3, 3, action_dim, action_latent_dim=action_dim or None, width=8,
            discretization=discretization, key=jr.key(5),
        )  # fmt: skip
        identity = eqx.nn.Identity()
        if action_dim:
            return eqx.tree_at(lambda m: (m.encoder, m.action_encoder), model, (identity,) * 2)
        return eqx.tree_at(lambda m: m.encoder, model, identity)

    model, autonomous = build(2), build(0)
    x0, us = jnp.ones(3), jnp.ones((STEPS, 2))
    ts = 0.01 * jnp.arange(STEPS + 1.0)
    highest = (jax.lax.Precision.HIGHEST,) * 2
    runs = {
        f"unroll {method}": lambda method=method: ls.unroll(
            model, x0, us, steps=STEPS, reencode_every=5, method=method
        )
        for method in ("parallel", "sequential")
    }
    runs["unroll readout"] = lambda: ls.unroll(autonomous, x0, steps=STEPS)
    runs["exact flow"] = lambda: ls.unroll_continuous(
        autonomous, x0, ts, reencode_dt=0.05, exact=True
    )
    runs["vector field"] = lambda: model.dynamics.vector_field(x0, us[0])
    runs["decoder"] = lambda: model.decode(x0)
    # Traced times: one exponential per output time (the other branch of the exact flow).
    traced = lambda ts: ls.unroll_continuous(
        autonomous, x0, ts, reencode_dt=0.05, num_segments=5, exact=True
    )
    runs = {name: (run, ()) for name, run in runs.items()}
    runs["exact flow, traced times"] = (traced, (ts,))
    for name, (run, args) in runs.items():
        # As on a GPU (the suite's default is "highest", see conftest.py).
        with jax.default_matmul_precision("tensorfloat32"):
            precisions = _dot_precisions(jax.make_jaxpr(run)(*args).jaxpr)
        assert precisions and all(p == highest for p in precisions), (name, precisions)


def test_models_pickle():
    """The MLPs held `jax.nn.relu` (a `custom_jvp` object pickle cannot find by name)
    and `eqx.nn.MLP`'s default final activation, a lambda: pickling failed."""
    x = jnp.linspace(-1, 1, 3)
    models = [
        ls.KoopmanAutoencoder(3, 4, width=8, encoder_layers=2, key=jr.key(0)),
        ls.KoopmanAutoencoder(3, 4, width=8, decoder="mlp", dynamics="mlp", key=jr.key(1)),
        ls.KoopmanAutoencoder(3, 4, action_dim=1, width=8, action_head=True, key=jr.key(2)),
    ]
    u = jnp.ones(1)
    for model in models:
        copy = pickle.loads(pickle.dumps(model))
        for m in (model, copy):
            v = None if m.action_dim == 0 else m.encode_action(u)
            out = m.decode(m.step(m.encode(x), v))
            if m is model:
                want = out
        np.testing.assert_array_equal(out, want)
    baseline = ls.MLPBaseline(3, width=8, layers=2, key=jr.key(3))
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(baseline))(x), baseline(x))


@pytest.mark.parametrize(
    "options",
    [
        {"decoder": "mlp", "decoder_layers": 3, "discretization": "exact", "dt": 0.02},
        {"dynamics": "mlp", "dynamics_width": 12, "encoder_layers": 2},
        {"action_dim": 2, "action_latent_dim": 5, "action_head": True},
        {"action_head": True, "head_action_dim": 3},
    ],
)
def test_config_rebuilds_the_model_for_a_checkpoint(tmp_path, options):
    """`config()` is JSON, and the model it builds is a template that loads the saved
    weights without a warning about static fields, and reports the same config."""
    model = ls.KoopmanAutoencoder(3, 8, width=16, key=jr.key(0), **options)
    baseline = ls.MLPBaseline(3, 1, width=9, layers=3, key=jr.key(0))
    config = json.loads(json.dumps(model.config()))
    assert {k: config[k] for k in options} == options
    template = eqx.filter_eval_shape(
        lambda: (
            ls.KoopmanAutoencoder(**config, key=jr.key(1)),
            ls.MLPBaseline(**baseline.config(), key=jr.key(1)),
        )
    )
    ls.save_checkpoint(tmp_path, 0, model=(model, baseline))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = ls.load_checkpoint(tmp_path, model=template).model
    assert loaded[0].config() == config and loaded[1].config() == baseline.config()
    for a, b in zip(jax.tree.leaves((model, baseline)), jax.tree.leaves(loaded), strict=True):
        np.testing.assert_array_equal(a, b)
