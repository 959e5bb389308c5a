"""Oracle tests for the SSM core: S4D kernels and FFT convolution."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from jax.test_util import check_grads

import lineax_seq as ls
from lineax_seq._numerics import fft_size

INITS = ["lin", "inv", "real", "legs"]
DISCRETIZATIONS = ["zoh", "bilinear"]


def _continuous(kernel):
    """(A, B, C, dt) from the stored real parameters, in float64 numpy."""

    def get(name):
        return np.asarray(getattr(kernel, name), np.float64)

    a = -np.exp(get("log_neg_real_a")) + 1j * get("imag_a")
    b = get("b_real") + 1j * get("b_imag")
    c = get("c_real") + 1j * get("c_imag")
    dt = np.exp(get("log_dt"))[:, None]
    return a, b, c, dt


def _loop_kernel(kernel, length):
    """K[c, l] = sum over the full conjugate-pair state of C Abar^l Bbar, by a plain loop."""
    a, b, c, dt = _continuous(kernel)
    if kernel.discretization == "zoh":
        abar = np.exp(dt * a)
        bbar = np.expm1(dt * a) / a * b  # (abar - 1) / a cancels for |dt A| << 1
    else:
        abar = (1 + dt * a / 2) / (1 - dt * a / 2)
        bbar = dt * b / (1 - dt * a / 2)
    # The full state holds each mode and its conjugate.
    abar = np.concatenate([abar, abar.conj()], axis=-1)
    bbar = np.concatenate([bbar, bbar.conj()], axis=-1)
    c = np.concatenate([c, c.conj()], axis=-1)
    out = np.zeros((kernel.channels, length))
    power = np.ones_like(abar)
    for step in range(length):
        out[:, step] = np.real(np.sum(c * power * bbar, axis=-1))
        power = power * abar
    return out


@pytest.fixture(scope="module")
def all_kernels():
    """Every init x discretisation, evaluated at lengths 1 and 70 in one compile."""
    kernels = {
        (init, disc): ls.S4DKernel(8, 3, init=init, discretization=disc, key=jr.key(i))
        for i, (init, disc) in enumerate((init, disc) for init in INITS for disc in DISCRETIZATIONS)
    }
    values = eqx.filter_jit(lambda ks: {name: (k(1), k(70)) for name, k in ks.items()})(kernels)
    return kernels, values


@pytest.mark.parametrize("discretization", DISCRETIZATIONS)
@pytest.mark.parametrize("init", INITS)
def test_kernel_equals_loop(init, discretization, all_kernels):
    kernels, values = all_kernels
    kernel = kernels[init, discretization]
    for length, k in zip((1, 70), values[init, discretization], strict=True):
        # 70 is not a multiple of the block size
        assert k.shape == (3, length) and k.dtype == jnp.float32
        expected = _loop_kernel(kernel, length)
        np.testing.assert_allclose(k, expected, atol=1e-5 * np.abs(expected).max())


@pytest.mark.parametrize("discretization", DISCRETIZATIONS)
def test_discretize_matches_kernel(discretization, getkey):
    kernel = ls.S4DKernel(6, 2, init="inv", discretization=discretization, key=getkey())
    abar, cb, k = eqx.filter_jit(lambda m: (*m.discretize(), m(40)))(kernel)
    assert abar.shape == cb.shape == (2, 3)
    assert jnp.iscomplexobj(abar) and jnp.iscomplexobj(cb)
    abar, cb = np.asarray(abar, np.complex128), np.asarray(cb, np.complex128)
    expected = np.stack([2 * np.real(np.sum(cb * abar**step, -1)) for step in range(40)], -1)
    np.testing.assert_allclose(k, expected, atol=1e-5 * np.abs(expected).max())


def test_bilinear_zero_abar_is_finite():
    """`dt A = -2` maps to `Abar = 0` under the bilinear transform (a valid system that
    forgets at once); its log was -inf and the kernel all NaN. Both conv methods and the
    recurrence agree with the loop."""
    kernel = ls.S4DKernel(8, 1, init="real", discretization="bilinear", key=jr.key(0))
    kernel = eqx.tree_at(
        lambda k: k.log_dt, kernel, jnp.zeros(1)
    )  # dt = 1: the mode A = -2 gives 0
    assert np.any(np.asarray(kernel.discretize()[0]) == 0)
    x = jr.normal(jr.key(1), (9, 1))
    layers = [
        eqx.tree_at(
            lambda m: m.kernel,
            ls.S4D(1, state_size=8, init="real", discretization="bilinear", conv=c, key=jr.key(0)),
            kernel,
        )
        for c in ("fft", "chunked")
    ]

    @eqx.filter_jit
    def run(kernel, layers, x):
        # The kernel, and each layer's convolution and recurrence, in one compilation.
        recurrence = lambda m: jax.lax.scan(lambda s, x_t: m.step(s, x_t), m.init_state(), x)[1]
        return kernel(9), [(layer(x), recurrence(layer)) for layer in layers]

    k, outputs = run(kernel, layers, x)
    np.testing.assert_allclose(k, _loop_kernel(kernel, 9), atol=1e-5)
    for y, steps in outputs:
        assert np.all(np.isfinite(y))
        np.testing.assert_allclose(y, steps, atol=1e-5)


def test_inits(getkey):
    n = 16
    modes = np.arange(n // 2)
    a = {}
    for init in INITS:
        kernel = ls.S4DKernel(n, 2, init=init, key=getkey())
        a[init] = -np.exp(np.asarray(kernel.log_neg_real_a[0])) + 1j * np.asarray(kernel.imag_a[0])
        assert np.allclose(kernel.log_neg_real_a[0], kernel.log_neg_real_a[1])
    np.testing.assert_allclose(a["lin"], -0.5 + 1j * np.pi * modes, rtol=1e-6)
    inv_imag = n / np.pi * (n / (2 * modes + 1) - 1)
    np.testing.assert_allclose(a["inv"], -0.5 + 1j * inv_imag, rtol=1e-6)
    np.testing.assert_allclose(a["real"], -(modes + 1.0), rtol=1e-6)
    # HiPPO-LegS: A[i, j] = -sqrt(2i+1) sqrt(2j+1) (i > j), -(i+1) (i = j), 0 (i < j);
    # its normal part is A + P P^T with P_i = sqrt(i + 1/2).
    hippo = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            if i > j:
                hippo[i, j] = -np.sqrt(2 * i + 1) * np.sqrt(2 * j + 1)
            elif i == j:
                hippo[i, j] = -(i + 1)
    p = np.sqrt(np.arange(n) + 0.5)
    eig, vectors = np.linalg.eig(hippo + np.outer(p, p))
    upper = np.argsort(np.where(eig.imag > 0, eig.imag, np.inf))[: n // 2]
    np.testing.assert_allclose(eig[upper].real, -0.5, atol=1e-6)
    np.testing.assert_allclose(a["legs"], -0.5 + 1j * eig[upper].imag, rtol=1e-5)
    # S4D-LegS's B: HiPPO-LegS's B_i = sqrt(2i + 1) in the eigenbasis, halved (its
    # magnitude); every other initialisation starts at B = 1.
    legs_b = np.abs(np.linalg.solve(vectors, np.sqrt(2 * np.arange(n) + 1.0))[upper]) / 2
    for init in INITS:
        kernel = ls.S4DKernel(n, 2, init=init, key=getkey())
        want = np.broadcast_to(legs_b if init == "legs" else 1.0, (2, n // 2))
        np.testing.assert_allclose(kernel.b_real, want, rtol=1e-5)
        np.testing.assert_array_equal(kernel.b_imag, 0)


def test_parameters_real_and_init_statistics(getkey):
    kernel = ls.S4DKernel(64, 64, dt_min=1e-3, dt_max=1e-1, key=getkey())
    leaves = jax.tree.leaves(eqx.filter(kernel, eqx.is_array))
    assert all(jnp.issubdtype(x.dtype, jnp.floating) for x in leaves)
    np.testing.assert_array_equal(kernel.b_real, 1.0)
    np.testing.assert_array_equal(kernel.b_imag, 0.0)
    for part in (kernel.c_real, kernel.c_imag):
        assert abs(float(jnp.var(part)) - 0.5) < 0.05
    assert float(kernel.log_dt.min()) >= np.log(1e-3) and float(kernel.log_dt.max()) <= np.log(1e-1)
    # S4D's step sizes: log dt uniform on [log dt_min, log dt_max] (not dt uniform, whose
    # median would be 5e-2 here instead of 1e-2).
    wide = ls.S4DKernel(2, 4096, dt_min=1e-3, dt_max=1e-1, key=getkey())
    quartiles = np.quantile(np.asarray(wide.log_dt), [0.25, 0.5, 0.75])
    np.testing.assert_allclose(
        quartiles, np.log(1e-3) + np.log(100) * np.array([0.25, 0.5, 0.75]), atol=0.15
    )
    # Any value of the stored log keeps Re(A) < 0: the discrete system stays stable.
    for shift in (-3.0, 3.0):
        bumped = eqx.tree_at(lambda k: k.log_neg_real_a, kernel, kernel.log_neg_real_a + shift)
        abar, _ = bumped.discretize()
        assert bool(jnp.all(jnp.abs(abar) < 1))


def test_bilinear_approaches_zoh_as_dt_shrinks(getkey):
    key = getkey()
    errors = []
    kernels = [
        [
            ls.S4DKernel(8, 2, init="inv", discretization=d, dt_min=dt, dt_max=1.0001 * dt, key=key)
            for d in DISCRETIZATIONS
        ]
        for dt in (1e-2, 1e-3, 1e-4)
    ]
    values = eqx.filter_jit(lambda ks: [[k(64) for k in pair] for pair in ks])(kernels)
    for zoh, bil in values:
        zoh, bil = np.asarray(zoh, np.float64), np.asarray(bil, np.float64)
        errors.append(np.abs(zoh - bil).max() / np.abs(zoh).max())
    assert errors[-1] < 1e-3
    assert errors[0] > 10 * errors[-1]


def test_length_generalisation_prefix(getkey):
    kernel = ls.S4DKernel(8, 2, key=getkey())
    long, short = eqx.filter_jit(lambda k: (k(300), k(37)))(kernel)
    np.testing.assert_allclose(long[:, :37], short, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("init", INITS)
def test_long_kernel_finite_and_accurate(init, getkey):
    length = 65_536
    kernel = ls.S4DKernel(64, 2, init=init, dt_min=1e-3, dt_max=2e-3, key=getkey())
    k = jax.jit(lambda m: m(length))(kernel)
    assert k.shape == (2, length)
    assert bool(jnp.all(jnp.isfinite(k)))
    # Against the float64 Vandermonde sum at scattered positions (including the end).
    a, b, c, dt = _continuous(kernel)
    abar = np.exp(dt * a)
    cb = c * (abar - 1) / a * b
    positions = np.array([0, 1, 17, 1000, 4097, 30_000, length - 1])
    exponent = dt[..., None] * a[..., None] * positions
    expected = 2 * np.real(np.einsum("cn,cnl->cl", cb, np.exp(exponent)))
    # float32 rounds each mode's exponent `l dt A` by a few eps |l dt A|, so fast modes
    # with a large B (S4D-LegS's) may err by up to that fraction of their own size.
    modes = 2 * np.abs(cb)[..., None] * np.exp(exponent.real)
    atol = 1e-5 * np.abs(expected).max() + 3e-7 * (modes * np.abs(exponent)).sum(1)
    np.testing.assert_array_less(np.abs(np.asarray(k)[:, positions] - expected), atol)


def test_bilinear_decay_of_fast_modes_in_float32(getkey):
    """The bilinear `|Abar| = |1 + h| / |1 - h|` (`h = dt A / 2`) nears 1 again where
    `|h| >> 1`: its log, the difference of two nearly equal float32 logs, was 2% off at
    dt = 0.1 and 21% at dt = 1 for the fastest S4D-Inv modes (a time constant of ~40k
    steps off by as much); it is now one `log1p`, to float32 rounding."""
    for dt in (0.01, 0.1, 1.0):
        for init in ("inv", "legs", "lin"):
            kernel = ls.S4DKernel(
                64, 1, init=init, discretization="bilinear", dt_min=dt, dt_max=dt * 1.001,
                key=getkey(),
            )  # fmt: skip
            log_abar = np.asarray(kernel._discretize()[0])
            a, _, _, step = _continuous(kernel)
            h = step * a / 2
            np.testing.assert_allclose(log_abar.real, np.log(np.abs((1 + h) / (1 - h))), rtol=1e-5)
            turn = np.angle(np.exp(1j * (log_abar.imag - np.angle((1 + h) / (1 - h)))))
            np.testing.assert_allclose(turn, 0, atol=1e-6)


@pytest.mark.parametrize("discretization", DISCRETIZATIONS)
def test_small_dt_long_kernel_accurate_in_float32(discretization, getkey):
    """At dt ~ 1e-4 the decay per step is 1 - O(1e-4): a float32 `Abar` (or bilinear
    quotient) rounded before its log would err by ~1e-4 relative at 65k steps."""
    length = 65_536
    kernel = ls.S4DKernel(
        16, 2, discretization=discretization, dt_min=1e-4, dt_max=2e-4, key=getkey()
    )
    k = jax.jit(lambda m: m(length))(kernel)
    a, b, c, dt = _continuous(kernel)
    if discretization == "zoh":
        log_abar = dt * a
        cb = c * np.expm1(dt * a) / a * b
    else:
        log_abar = np.log((1 + dt * a / 2) / (1 - dt * a / 2))
        cb = c * dt * b / (1 - dt * a / 2)
    positions = np.array([0, 1, 1000, 30_000, length - 1])
    expected = 2 * np.real(np.einsum("cn,cnl->cl", cb, np.exp(log_abar[..., None] * positions)))
    scale = np.abs(expected).max()
    np.testing.assert_allclose(np.asarray(k)[:, positions], expected, atol=3e-6 * scale)


def test_zoh_near_zero_real_part_has_finite_gradients():
    """A real mode (`Im A = 0`) whose `Re A` trains towards 0: zero-order hold's
    `Bbar = (exp(dt A) - 1) / A B` tends to `dt B`. Its gradient divided by `A^2`, which
    underflows in float32 (NaN from `log_neg_real_a = -44`), and at `Re A = -0.0`
    (`log_neg_real_a` below ~-104) the kernel itself was 0 / 0."""
    kernel = ls.S4DKernel(4, 1, init="real", key=jr.key(0))
    loss = lambda k: jnp.sum(k(16) ** 2)

    @jax.jit
    def run(value):
        k = eqx.tree_at(
            lambda k: k.log_neg_real_a, kernel, kernel.log_neg_real_a.at[0, 0].set(value)
        )
        return k(16), jax.grad(loss)(k)

    for value in (-44.0, -60.0, -120.0):
        k, grads = run(value)
        assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads)), value
        # Mode 0 tends to a pure integrator (Abar = 1, Bbar = dt B); the loop kernel
        # from float64 parameters (Re A = -0.0 at -120 is 0 / 0 there too).
        limit = eqx.tree_at(
            lambda k: k.log_neg_real_a, kernel, kernel.log_neg_real_a.at[0, 0].set(-60)
        )
        reference = _loop_kernel(limit, 16)
        np.testing.assert_allclose(k, reference, atol=1e-5 * np.abs(reference).max())


def test_kernel_grads(getkey):
    kernel = ls.S4DKernel(4, 2, discretization="bilinear", key=getkey())
    params, static = eqx.partition(kernel, eqx.is_array)
    weights = jr.normal(getkey(), (2, 12))

    @jax.jit
    def f(p):
        return jnp.sum(weights * eqx.combine(p, static)(12))

    check_grads(f, (params,), order=1, modes=["rev"], eps=1e-3, atol=2e-2, rtol=2e-2)


# --------------------------------------------------------------------------- fft_conv


def _direct_conv(u, k, kb=None):
    u, k = np.asarray(u, np.float64), np.asarray(k, np.float64)
    length, channels = u.shape
    k = np.broadcast_to(k, (channels, length))
    kb = None if kb is None else np.broadcast_to(np.asarray(kb, np.float64), (channels, length))
    y = np.zeros_like(u)
    for t in range(length):
        for s in range(length):
            if s <= t:
                y[t] += k[:, t - s] * u[s]
            elif kb is not None:
                y[t] += kb[:, s - t - 1] * u[s]
    return y


@pytest.mark.parametrize("kc", [1, 3])
def test_fft_conv_causal_equals_direct(kc, getkey):
    u = jr.normal(getkey(), (37, 3))
    k = jr.normal(getkey(), (kc, 37))
    y = ls.fft_conv(u, k)
    assert y.shape == (37, 3) and y.dtype == u.dtype
    np.testing.assert_allclose(y, _direct_conv(u, k), atol=1e-4)


@pytest.mark.parametrize("kc", [1, 3])
def test_fft_conv_bidirectional_equals_direct(kc, getkey):
    u = jr.normal(getkey(), (37, 3))
    k, kb = jr.normal(getkey(), (2, kc, 37))
    np.testing.assert_allclose(ls.fft_conv(u, k, kb), _direct_conv(u, k, kb), atol=1e-4)


def test_fft_conv_bidirectional_flag_splits_stacked_kernels(getkey):
    """`bidirectional=True` reads `k` as forward kernels over backward ones (S4's layout)."""
    u = jr.normal(getkey(), (37, 3))
    k, kb = jr.normal(getkey(), (2, 3, 37))
    stacked = jnp.concatenate([k, kb])
    np.testing.assert_allclose(
        ls.fft_conv(u, stacked, bidirectional=True), _direct_conv(u, k, kb), atol=1e-4
    )
    causal = ls.fft_conv(u, k, bidirectional=False)
    np.testing.assert_allclose(causal, _direct_conv(u, k), atol=1e-4)
    np.testing.assert_allclose(
        ls.fft_conv(u, k, kb, bidirectional=True), _direct_conv(u, k, kb), atol=1e-4
    )
    for bad in (k, stacked[:4]):  # odd rows; 2 * 2 rows for 3 channels (named as given)
        with pytest.raises(
            ValueError, match=rf"bidirectional=True.*\(2 \* kc, length=37\).*{bad.shape[0]}, 37"
        ):
            ls.fft_conv.__wrapped__(u, bad, bidirectional=True)
    with pytest.raises(TypeError, match="bidirectional must be a bool, got bidirectional=1"):
        ls.fft_conv.__wrapped__(u, k, bidirectional=1)


def test_fft_conv_bidirectional_impulse_response(getkey):
    length, p = 20, 7
    k, kb = jr.normal(getkey(), (2, 1, length))
    u = jnp.zeros((length, 1)).at[p, 0].set(1.0)
    y = np.asarray(ls.fft_conv(u, k, kb))[:, 0]
    # Lag 0 (t = p) comes from the forward kernel only.
    np.testing.assert_allclose(y[p:], k[0, : length - p], atol=1e-5)
    np.testing.assert_allclose(y[:p], kb[0, :p][::-1], atol=1e-5)


def test_fft_conv_is_causal(getkey):
    u = jr.normal(getkey(), (30, 2))
    k = jr.normal(getkey(), (2, 30))
    v = u.at[11:].add(jr.normal(getkey(), (19, 2)))
    np.testing.assert_allclose(ls.fft_conv(u, k)[:11], ls.fft_conv(v, k)[:11], atol=1e-5)


def test_fft_conv_grads(getkey):
    u = jr.normal(getkey(), (9, 2))
    k, kb = jr.normal(getkey(), (2, 2, 9))

    @jax.jit
    def f(u, k, kb):
        return ls.fft_conv(u, k, kb)

    check_grads(f, (u, k, kb), order=1, modes=["rev"], eps=1e-2, atol=1e-2, rtol=1e-2)


def test_fft_size():
    def smooth(m):
        for p in (2, 3, 5):
            while m % p == 0:
                m //= p
        return m == 1

    for minimum in (1, 2, 7, 14, 74, 1000, 2049, 4097):
        size = fft_size(minimum)
        assert size >= minimum and smooth(size)
        assert not any(smooth(s) for s in range(minimum, size))


# --------------------------------------------------------------------------- errors


def test_kernel_bad_inputs(getkey, no_jaxtyping):
    key = getkey()
    with pytest.raises(ValueError, match="state_size.*7"):
        ls.S4DKernel(7, key=key)
    with pytest.raises(ValueError, match="init.*'diag'"):
        ls.S4DKernel(8, init="diag", key=key)
    with pytest.raises(ValueError, match="discretization.*'euler'"):
        ls.S4DKernel(8, discretization="euler", key=key)
    with pytest.raises(ValueError, match="dt_min=0.1.*dt_max=0.01.*pass a larger dt_max"):
        ls.S4DKernel(8, dt_min=0.1, dt_max=0.01, key=key)
    with pytest.raises(ValueError, match="dt_min=0.0"):
        ls.S4DKernel(8, dt_min=0.0, dt_max=0.1, key=key)
    with pytest.raises(ValueError, match="dt_min must be a positive, finite real.*True"):
        ls.S4DKernel(8, dt_min=True, dt_max=2.0, key=key)  # a flag, not a step size
    # A concrete JAX or NumPy scalar is a number (it was refused as out of range).
    np.testing.assert_array_equal(
        ls.S4DKernel(8, dt_min=jnp.asarray(1e-3), dt_max=np.float32(0.1), key=key).log_dt,
        ls.S4DKernel(8, dt_min=1e-3, dt_max=0.1, key=key).log_dt,
    )
    with pytest.raises(ValueError, match="channels=0"):
        ls.S4DKernel(8, 0, key=key)
    with pytest.raises(ValueError, match="length=0"):
        ls.S4DKernel(8, key=key)(0)
    # A JAX integer is refused for what it is (a length fixes shapes), not as "not a
    # positive integer"; a NumPy one is a length.
    kernel = ls.S4DKernel(8, key=key)
    with pytest.raises(ValueError, match="known when the program is traced.*got a JAX array"):
        kernel(jnp.asarray(10))
    with pytest.raises(ValueError, match="mark it static"):
        jax.jit(lambda n: kernel(n))(10)
    assert kernel(np.int64(10)).shape == (1, 10)


def test_fft_conv_bad_inputs(getkey):
    u = jnp.ones((10, 3))
    # The tests run under jaxtyping's import hook; users without it call the function
    # itself, whose own checks must catch the same mistakes.
    unchecked = ls.fft_conv.__wrapped__
    for conv in (ls.fft_conv, unchecked):
        with pytest.raises(ValueError, match="k must have shape .* channels=3"):
            conv(u, jnp.ones((2, 10)))
        with pytest.raises((ValueError, TypeError), match="k"):
            conv(u, jnp.ones((3, 11)))  # longer than u: would wrap around the FFT
        with pytest.raises((ValueError, TypeError), match="u"):
            conv(jnp.ones(10), jnp.ones((1, 10)))
    with pytest.raises(ValueError, match=r"k must have shape \(kc, length=10\)"):
        unchecked(u, jnp.ones((3, 5)), jnp.ones((3, 5)))  # would misplace the backward lags
    with pytest.raises(
        ValueError, match=r"k_backward must have the shape of k=\(3, 10\).*\(3, 9\)"
    ):
        unchecked(u, jnp.ones((3, 10)), jnp.ones((3, 9)))  # would shift the backward lags
    with pytest.raises(TypeError, match="u must have a floating dtype"):
        unchecked(jnp.ones((10, 3), jnp.int32), jnp.ones((3, 10)))
    with pytest.raises(TypeError, match="k must have a real floating dtype.*complex64"):
        unchecked(u, jnp.ones((3, 10), jnp.complex64))  # its imaginary part was dropped
    with pytest.raises(TypeError, match="k_backward must have a real floating dtype.*bool"):
        unchecked(u, jnp.ones((3, 10)), jnp.ones((3, 10), bool))


@pytest.mark.parametrize("name", ["u", "k", "k_backward"])
@pytest.mark.parametrize("bad", [None, "list"])
def test_fft_conv_takes_numpy_and_names_non_arrays(name, bad, getkey):
    """NumPy arrays are arrays, as the hints say (with the import hook and without);
    `None` or a list is a `TypeError` naming the argument (it was an AttributeError)."""
    u, k, kb = jr.normal(getkey(), (6, 2)), jr.normal(getkey(), (2, 6)), jr.normal(getkey(), (2, 6))
    expected = ls.fft_conv(u, k, kb)
    for conv in (ls.fft_conv, ls.fft_conv.__wrapped__):
        np.testing.assert_allclose(conv(*map(np.asarray, (u, k, kb))), expected, atol=1e-6)
        args = {"u": u, "k": k, "k_backward": kb}
        args[name] = None if bad is None else np.asarray(args[name]).tolist()
        if name == "k_backward" and bad is None:
            continue  # optional
        with pytest.raises(TypeError, match=name):
            conv(**args)


@pytest.mark.parametrize("name", ["u", "abar", "cb", "skip"])
def test_chunked_conv_takes_numpy_and_names_non_arrays(name, getkey):
    """As for `fft_conv`: NumPy arrays in, a list a `TypeError` naming the argument."""
    layer = ls.S4D(2, state_size=2, key=getkey())
    abar, cb = layer.kernel.discretize()
    args = {"u": jr.normal(getkey(), (6, 2)), "abar": abar, "cb": cb, "skip": layer.skip}
    expected = ls.chunked_conv(**args)
    for conv in (ls.chunked_conv, ls.chunked_conv.__wrapped__):
        numpy = conv(**{n: np.asarray(a) for n, a in args.items()})
        np.testing.assert_allclose(numpy, expected, atol=1e-6)
        with pytest.raises(TypeError, match=name):
            conv(**{**args, name: np.asarray(args[name]).tolist()})
    if name != "skip":
        with pytest.raises(TypeError, match=f"{name} must be a JAX or NumPy array, got {name}="):
            ls.chunked_conv.__wrapped__(**{**args, name: None})


def test_fft_conv_low_precision(getkey):
    """bfloat16 / float16 inputs are convolved in float32 and returned in their dtype."""
    u = jr.normal(getkey(), (12, 3))
    k, kb = jr.normal(getkey(), (2, 3, 12))
    expected = ls.fft_conv(u, k, kb)
    for dtype in (jnp.bfloat16, jnp.float16):
        y = ls.fft_conv(u.astype(dtype), k.astype(dtype), kb.astype(dtype))
        assert y.dtype == dtype
        np.testing.assert_allclose(y.astype(jnp.float32), expected, atol=0.1, rtol=0.02)
    # Kernels of two float dtypes (strict promotion refused to join them).
    y = ls.fft_conv(u, k, kb.astype(jnp.bfloat16))
    np.testing.assert_allclose(y, expected, atol=0.1, rtol=0.02)
    # Neither is rounded to the other's dtype: a float32 backward kernel stays float32.
    k16 = k.astype(jnp.bfloat16)
    y = ls.fft_conv(u, k16, kb)
    np.testing.assert_allclose(y, ls.fft_conv(u, k16.astype(jnp.float32), kb), rtol=1e-6, atol=1e-6)


def test_kernel_parameters_follow_x64():
    """All parameters take JAX's default float dtype: float64 under `jax_enable_x64`."""
    with jax.enable_x64(True):
        kernel = ls.S4DKernel(4, 2, key=jr.key(0))
    leaves = jax.tree.leaves(eqx.filter(kernel, eqx.is_array))
    assert {leaf.dtype for leaf in leaves} == {jnp.dtype(jnp.float64)}


def test_half_precision_parameters(getkey):
    """A layer cast to bfloat16 (parameters and input) computes its kernel in float32 and
    returns bfloat16 close to the float32 layer, in both modes."""
    layer = ls.S4D(3, state_size=8, key=getkey())
    x = jr.normal(getkey(), (16, 3))
    half = jax.tree.map(lambda a: a.astype(jnp.bfloat16) if eqx.is_inexact_array(a) else a, layer)
    y = half(x.astype(jnp.bfloat16))
    assert y.dtype == jnp.bfloat16
    np.testing.assert_allclose(y.astype(jnp.float32), layer(x), atol=0.1, rtol=0.05)
    state, y0 = half.step(half.init_state(), x[0].astype(jnp.bfloat16))
    assert state.dtype == jnp.complex64 and y0.dtype == jnp.bfloat16
    np.testing.assert_allclose(y0.astype(jnp.float32), y[0].astype(jnp.float32), atol=0.05)
    kernel = half.kernel(16)  # as documented: float32, close to the float32 kernel
    assert kernel.dtype == jnp.float32
    np.testing.assert_allclose(kernel, layer.kernel(16), atol=0.05)
