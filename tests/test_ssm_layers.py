"""Oracle tests for the S4D layer (conv vs recurrent mode), HyenaFilter and linear_scan."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
import pytest
from jax.test_util import check_grads

import lineax_seq as ls


def _unroll(layer, x):
    """Run the layer in recurrent mode over a whole sequence."""

    def body(state, x_t):
        return layer.step(state, x_t)

    _, ys = jax.lax.scan(body, layer.init_state(), x)
    return ys


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(channels=1, discretization="bilinear", init="legs"),
        dict(activation=jax.nn.gelu, glu=True, init="inv", conv="chunked"),
    ],
    ids=["default", "shared-bilinear-legs", "gelu-glu"],
)
def test_s4d_convolution_equals_recurrence(options, getkey):
    layer = ls.S4D(3, state_size=6, key=getkey(), **options)
    x = jr.normal(getkey(), (50, 3))
    conv, rec = eqx.filter_jit(lambda m, x: (m(x), _unroll(m, x)))(layer, x)
    assert conv.shape == rec.shape == (50, 3)
    np.testing.assert_allclose(conv, rec, atol=2e-5 * float(jnp.abs(conv).max()))


def test_s4d_equals_explicit_recurrence(getkey):
    """The linear layer against x_t = Abar x_{t-1} + Bbar u_t, y_t = 2 Re(C x_t) + D u_t."""
    layer = ls.S4D(2, state_size=4, key=getkey())
    x = np.asarray(jr.normal(getkey(), (25, 2)), np.float64)
    kernel = layer.kernel
    a = -np.exp(np.asarray(kernel.log_neg_real_a, np.float64)) + 1j * np.asarray(kernel.imag_a)
    b = np.asarray(kernel.b_real) + 1j * np.asarray(kernel.b_imag)
    c = np.asarray(kernel.c_real) + 1j * np.asarray(kernel.c_imag)
    dt = np.exp(np.asarray(kernel.log_dt, np.float64))[:, None]
    abar = np.exp(dt * a)
    bbar = (abar - 1) / a * b
    state = np.zeros_like(abar)
    expected = []
    for u in x:
        state = abar * state + bbar * u[:, None]
        expected.append(2 * np.real(np.sum(c * state, -1)) + np.asarray(layer.skip) * u)
    out = eqx.filter_jit(layer)(jnp.asarray(x, jnp.float32))
    np.testing.assert_allclose(out, np.stack(expected), atol=1e-4)


def test_s4d_skip_starts_standard_normal(getkey):
    """`D ~ N(0, 1)` per feature, S4D's initialisation."""
    skip = ls.S4D(dim=512, state_size=4, key=getkey()).skip
    assert abs(float(jnp.mean(skip))) < 0.15 and 0.85 < float(jnp.std(skip)) < 1.15


def test_s4d_causal(getkey):
    layer = ls.S4D(2, state_size=4, activation=jax.nn.gelu, glu=True, key=getkey())
    x = jr.normal(getkey(), (40, 2))
    y = x.at[21:].add(jr.normal(getkey(), (19, 2)))
    out_x, out_y = eqx.filter_jit(lambda m, x: jax.vmap(m)(x))(layer, jnp.stack([x, y]))
    np.testing.assert_allclose(out_x[:21], out_y[:21], atol=1e-5)
    assert not np.allclose(out_x[21:], out_y[21:])


def test_s4d_bidirectional(getkey):
    layer = ls.S4D(3, state_size=4, channels=1, bidirectional=True, key=getkey())
    x = jr.normal(getkey(), (30, 3))

    @eqx.filter_jit
    def run(m, x):
        expected = ls.fft_conv(x, m.kernel(30), m.kernel_backward(30)) + m.skip * x
        return expected, jax.vmap(m)(jnp.stack([x, x.at[20:].add(1.0)]))

    expected, (out_x, out_y) = run(layer, x)
    np.testing.assert_allclose(out_x, expected, atol=1e-5)
    assert not np.allclose(out_x[:20], out_y[:20])  # the future matters
    with pytest.raises(ValueError, match="bidirectional"):
        layer.init_state()


def test_s4d_any_length_and_vmap(getkey):
    layer = ls.S4D(4, state_size=8, key=getkey())
    x = jr.normal(getkey(), (2, 9, 4))
    one, long, single, batched = eqx.filter_jit(
        lambda m, x: (m(x[0, :1]), m(jnp.ones((129, 4))), m(x[1]), jax.vmap(m)(x))
    )(layer, x)
    assert one.shape == (1, 4) and long.shape == (129, 4)
    np.testing.assert_allclose(batched[1], single, atol=1e-6)


def test_s4d_grads(getkey):
    layer = ls.S4D(2, state_size=4, glu=True, key=getkey())
    x = jr.normal(getkey(), (8, 2))
    params, static = eqx.partition(layer, eqx.is_array)

    @jax.jit
    def f(p, x):
        return jnp.sum(jnp.sin(eqx.combine(p, static)(x)))

    check_grads(f, (params, x), order=1, modes=["rev"], eps=1e-3, atol=2e-2, rtol=2e-2)


def test_s4d_bad_inputs(getkey):
    key = getkey()
    with pytest.raises(ValueError, match="state_size.*5"):
        ls.S4D(4, state_size=5, key=key)
    with pytest.raises(ValueError, match="channels.*3"):
        ls.S4D(4, channels=3, key=key)
    with pytest.raises(ValueError, match="init.*'foo'"):
        ls.S4D(4, init="foo", key=key)
    layer = ls.S4D(4, state_size=4, key=key)
    with pytest.raises(ValueError, match="x must have dim=4 features, got 5"):
        layer(jnp.ones((10, 5)))
    with pytest.raises(TypeError, match="x"):  # rank checked at run time (jaxtyping)
        layer(jnp.ones((2, 10, 4)))
    with pytest.raises((ValueError, TypeError), match="x_t"):
        layer.step(layer.init_state(), jnp.ones(3))
    with pytest.raises(ValueError, match=r"state must have shape .*\(4, 2\).*\(4, 3\)"):
        layer.step(jnp.zeros((4, 3), jnp.complex64), jnp.ones(4))
    for conv in ("fft", "chunked"):
        empty = ls.S4D(4, state_size=4, conv=conv, key=key)
        with pytest.raises(ValueError, match="x must have at least one position"):
            empty(jnp.ones((0, 4)))


def test_s4d_inputs_checked_without_jaxtyping(getkey, no_jaxtyping):
    """Integer inputs (whose result came back rounded) and inputs of the wrong rank (a
    forgotten `vmap`, which failed deep inside) are named by the layer itself."""
    layer = ls.S4D(3, state_size=4, key=getkey())
    state = layer.init_state()
    with pytest.raises(TypeError, match="x_t must have a real floating dtype.*int32"):
        layer.step(state, jnp.array([1, 2, 3], jnp.int32))
    with pytest.raises(TypeError, match="x must have a real floating dtype.*int32"):
        layer(jnp.ones((4, 3), jnp.int32))
    with pytest.raises(ValueError, match=r"x_t must have shape \(dim,\), got x_t.shape=\(2, 3\)"):
        layer.step(state, jnp.ones((2, 3)))
    with pytest.raises(ValueError, match=r"x must have shape \(length, dim\), got .*\(2, 4, 3\)"):
        layer(jnp.ones((2, 4, 3)))
    # A real state lost its imaginary part at every step (a 34% error over 200 steps).
    for bad in (jnp.zeros((3, 2)), jnp.zeros((3, 2), jnp.int32)):
        with pytest.raises(TypeError, match=f"state must be complex.*{bad.dtype}"):
            layer.step(bad, jnp.ones(3))


def test_s4d_options_checked(getkey, no_jaxtyping):
    key = getkey()
    with pytest.raises(TypeError, match="bidirectional='no'"):
        ls.S4D(4, bidirectional="no", key=key)
    with pytest.raises(TypeError, match="glu=1"):
        ls.S4D(4, glu=1, key=key)
    with pytest.raises(TypeError, match="activation='gelu'"):
        ls.S4D(4, activation="gelu", key=key)
    with pytest.raises(ValueError, match="dt_max=inf"):
        ls.S4D(4, dt_max=float("inf"), key=key)


def test_s4d_numpy_integer_sizes_and_trainable_activation(getkey, no_jaxtyping):
    """NumPy integers are sizes like Python ints (stored as ints); a module activation
    (PReLU) is a pytree field, so its parameter gets a gradient."""
    layer = ls.S4D(np.int64(3), state_size=np.int64(4), activation=eqx.nn.PReLU(), key=getkey())
    assert type(layer.dim) is int and type(layer.kernel.state_size) is int
    assert ls.S4DKernel(np.int64(4), key=getkey())(np.int64(5)).shape == (1, 5)
    x = jr.normal(getkey(), (6, 3))
    grads = eqx.filter_jit(eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2)))(layer)
    assert float(jnp.abs(grads.activation.negative_slope)) > 0


def test_s4d_output_dtype_follows_input(getkey):
    """bfloat16 in, bfloat16 out, whether kernels are shared or per feature, one- or
    two-directional, and from either convolution method or the recurrent mode: computed
    in float32 and rounded once (the float32 result on the same input, cast), the skip
    `D x` included."""
    x = jr.normal(getkey(), (40, 4)).astype(jnp.bfloat16)
    for channels, bidirectional in ((1, False), (4, False), (1, True), (4, True)):
        key = getkey()
        for conv in ("fft", "chunked"):
            layer = ls.S4D(
                4,
                state_size=4,
                channels=channels,
                bidirectional=bidirectional,
                conv=conv,
                key=key,
            )
            layer = eqx.tree_at(lambda m: m.skip, layer, 3 * layer.skip)  # D x matters
            y = layer(x)
            assert y.dtype == jnp.bfloat16
            once = layer(x.astype(jnp.float32)).astype(jnp.bfloat16)
            np.testing.assert_array_equal(y.astype(jnp.float32), once.astype(jnp.float32))
        if bidirectional:
            continue
        _, y_t = layer.step(layer.init_state(), x[0])
        assert y_t.dtype == jnp.bfloat16
        _, once = layer.step(layer.init_state(), x[0].astype(jnp.float32))
        np.testing.assert_array_equal(
            y_t.astype(jnp.float32), once.astype(jnp.bfloat16).astype(jnp.float32)
        )
    # With the GELU + GLU output (float32 parameters) too, under strict promotion.
    glu = ls.S4D(4, state_size=4, activation=jax.nn.gelu, glu=True, key=getkey())
    y = glu(x)
    assert y.dtype == jnp.bfloat16
    once = glu(x.astype(jnp.float32)).astype(jnp.bfloat16)
    np.testing.assert_array_equal(y.astype(jnp.float32), once.astype(jnp.float32))
    _, y_t = glu.step(glu.init_state(), x[0])
    assert y_t.dtype == jnp.bfloat16


# --------------------------------------------------------------------------- HyenaFilter


def test_hyena_filter_formula(getkey):
    filt = ls.HyenaFilter(3, order=8, max_length=16, emb_dim=5, depth=2, key=getkey())
    h = eqx.filter_jit(lambda f: f(20))(filt)
    assert h.shape == (3, 20)
    # Eq. 2.3.4 by hand: exp(-alpha_c t) * FFN(PositionalEncoding(t)), sine activations.
    t = np.arange(20) / 16
    f = np.linspace(1e-4, 1, 2)
    z = np.concatenate(
        [t[:, None], np.cos(2 * np.pi * t[:, None] * f), -np.sin(2 * np.pi * t[:, None] * f)], -1
    )
    for layer, w in zip(filt.layers, filt.frequencies, strict=True):
        z = np.sin(np.asarray(w) * (z @ np.asarray(layer.weight).T + np.asarray(layer.bias)))
    z = z @ np.asarray(filt.output.weight).T
    expected = np.exp(-np.asarray(filt.decay)[:, None] * t) * z.T
    np.testing.assert_allclose(h, expected, atol=1e-5)
    # Decay rates spread over the channels, from ln(100)/1.5 to ln(100)/0.3.
    np.testing.assert_allclose(filt.decay, np.log(100) / np.array([1.5, 0.5, 0.3]), rtol=1e-5)


def test_hyena_filter_precision_follows_parameters():
    """Under x64 the filter is float64-exact (positions were float32: 1e-6 off, and a
    strict-promotion error); a bfloat16 filter returns bfloat16 from float32 positions."""
    with jax.enable_x64(True):
        filt = ls.HyenaFilter(2, order=4, max_length=1000, emb_dim=5, depth=1, key=jr.key(0))
        h = eqx.filter_jit(lambda f: f(1000))(filt)
        assert h.dtype == jnp.float64
        t = np.arange(1000) / 1000
        f = np.linspace(1e-4, 1, 2)
        phase = 2 * np.pi * t[:, None] * f
        z = np.concatenate([t[:, None], np.cos(phase), -np.sin(phase)], -1)
        (layer,), (w,) = filt.layers, filt.frequencies
        z = np.sin(np.asarray(w) * (z @ np.asarray(layer.weight).T + np.asarray(layer.bias)))
        want = (
            np.exp(-np.asarray(filt.decay)[:, None] * t) * (z @ np.asarray(filt.output.weight).T).T
        )
        np.testing.assert_allclose(h, want, rtol=1e-12, atol=1e-13)
    half = jax.tree.map(lambda a: a.astype(jnp.bfloat16) if eqx.is_inexact_array(a) else a, filt)
    with jax.enable_x64(True):
        assert half(300).dtype == jnp.bfloat16
        np.testing.assert_allclose(half(300).astype(np.float64), h[:, :300], atol=0.05)
    # Positions stay float32: bfloat16 would round positions above 256 together.
    tau = half.positional_encoding(1000)[:, 0]
    assert tau.dtype == jnp.float32 and bool(jnp.all(jnp.diff(tau) > 0))


def test_hyena_positional_encoding_at_the_default_width(getkey):
    """Hyena's features at the default `emb_dim=33`: `tau`, then 16 bands at frequencies
    `linspace(1e-4, 15, 16)`."""
    filt = ls.HyenaFilter(2, order=4, max_length=64, key=getkey())
    assert filt.emb_dim == 33
    t = np.arange(100) / 64
    phase = 2 * np.pi * t[:, None] * np.linspace(1e-4, 15, 16)
    want = np.concatenate([t[:, None], np.cos(phase), -np.sin(phase)], -1)
    np.testing.assert_allclose(filt.positional_encoding(100), want, atol=1e-4)


def test_hyena_filter_positional_form(getkey):
    """`HyenaFilter(channels, order, max_length, key=...)` (the design sketch's call)."""
    key = getkey()
    positional = ls.HyenaFilter(3, 8, 16, key=key)
    keywords = ls.HyenaFilter(3, order=8, max_length=16, key=key)
    assert positional.max_length == 16 and positional.layers[0].out_features == 8
    np.testing.assert_array_equal(positional(20), keywords(20))


def test_hyena_filter_checks_its_decay_arguments(getkey, no_jaxtyping):
    make = lambda **kw: ls.HyenaFilter(3, 8, 16, key=getkey(), **kw)
    with pytest.raises(ValueError, match="slow_decay must be a positive, finite.*inf"):
        make(slow_decay=float("inf"))  # one channel would never decay
    with pytest.raises(ValueError, match="fast_decay must be a positive, finite.*'a'"):
        make(fast_decay="a")
    with pytest.raises(ValueError, match="target must be a positive, finite.*'x'"):
        make(target="x")
    with pytest.raises(ValueError, match="fast_decay <= slow_decay"):
        make(fast_decay=2.0, slow_decay=1.0)
    for target in (1.0, 2.0):  # target >= 1 would make the envelope grow
        with pytest.raises(ValueError, match=rf"target must be in \(0, 1\), got target={target}"):
            make(target=target)
    # Equal decay lengths are allowed: every channel then decays alike.
    same = make(fast_decay=1.0, slow_decay=1.0, target=0.01)
    np.testing.assert_allclose(same.decay, np.full(3, np.log(100)), rtol=1e-6)


def test_hyena_filter_extrapolates_beyond_max_length(getkey):
    filt = ls.HyenaFilter(2, max_length=32, key=getkey())
    long, short = eqx.filter_jit(lambda f: (f(100), f(32)))(filt)
    np.testing.assert_allclose(long[:, :32], short, atol=1e-6)
    assert bool(jnp.all(jnp.isfinite(long)))


def test_hyena_filter_grads_and_fixed_decay(getkey):
    filt = ls.HyenaFilter(2, order=4, max_length=8, emb_dim=3, depth=1, key=getkey())
    params, static = eqx.partition(filt, eqx.is_array)
    # The decay rates are not parameters: AdamW's decoupled weight decay, with zero
    # gradients, shrinks every leaf but leaves the decay envelope unchanged.
    optimizer = optax.adamw(0.1, weight_decay=1.0)
    zero = jax.tree.map(jnp.zeros_like, params)
    with jax.numpy_dtype_promotion("standard"):  # optax's step counts are int32
        updates, _ = jax.jit(optimizer.update)(zero, optimizer.init(params), params)
    decayed = eqx.combine(optax.apply_updates(params, updates), static)
    np.testing.assert_array_equal(decayed.decay, filt.decay)
    assert not np.allclose(decayed.bias, filt.bias)
    assert all(leaf.shape != (2,) or leaf is filt.bias for leaf in jax.tree.leaves(params))
    check_grads(
        jax.jit(lambda p: jnp.sum(jnp.sin(eqx.combine(p, static)(8)))),
        (params,),
        order=1,
        modes=["rev"],
        eps=1e-3,
        atol=2e-2,
        rtol=2e-2,
    )


def test_hyena_filter_bad_inputs(getkey, no_jaxtyping):
    with pytest.raises(ValueError, match="emb_dim.*4"):
        ls.HyenaFilter(2, max_length=8, emb_dim=4, key=getkey())
    with pytest.raises(ValueError, match="max_length.*0"):
        ls.HyenaFilter(2, max_length=0, key=getkey())
    with pytest.raises(TypeError, match="needs `max_length`"):
        ls.HyenaFilter(2, order=4, key=getkey())
    with pytest.raises(ValueError, match="fast_decay"):
        ls.HyenaFilter(2, max_length=8, fast_decay=2.0, slow_decay=1.0, key=getkey())
    with pytest.raises(ValueError, match="depth=True"):
        ls.HyenaFilter(2, max_length=8, depth=True, key=getkey())
    with pytest.raises(ValueError, match="frequency=nan"):
        ls.HyenaFilter(2, max_length=8, frequency=float("nan"), key=getkey())
    make = lambda f: ls.HyenaFilter(2, max_length=8, frequency=f, key=getkey())
    with pytest.raises(ValueError, match="frequency must be a finite real number"):
        eqx.filter_vmap(make)(jnp.array([1.0, jnp.inf]))  # an ensemble: every entry
    hyena = ls.HyenaFilter(2, max_length=8, key=getkey())
    for length in (0, -3, 2.5):
        with pytest.raises(ValueError, match=f"length={length}"):
            hyena.positional_encoding(length)


def test_hyena_filter_integer_frequency_is_trained(getkey, no_jaxtyping):
    """`frequency=10` (an int) still gives float, trainable sine frequencies."""
    hyena = ls.HyenaFilter(2, order=4, max_length=16, frequency=10, key=getkey())
    assert all(jnp.issubdtype(w.dtype, jnp.floating) for w in hyena.frequencies)
    grads = eqx.filter_jit(eqx.filter_grad(lambda h: jnp.sum(h(16) ** 2)))(hyena)
    assert all(g is not None and float(jnp.abs(g).max()) > 0 for g in grads.frequencies)


# --------------------------------------------------------------------------- linear_scan


def _loop(a, b, reverse=False, initial=None):
    a, b = np.asarray(a), np.asarray(b)
    x = np.zeros(b.shape[1:], b.dtype) if initial is None else np.asarray(initial)
    out = np.zeros_like(b)
    steps = range(len(b) - 1, -1, -1) if reverse else range(len(b))
    for t in steps:
        x = (a[t] @ x if a.ndim == 3 else a[t] * x) + b[t]
        out[t] = x
    return out


@pytest.mark.parametrize("dense", [False, True], ids=["diagonal", "dense"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_linear_scan_equals_loop(dense, reverse, getkey):
    shape = (23, 3, 3) if dense else (23, 3)
    a = jr.normal(getkey(), shape) * (0.5 if dense else 0.9)
    b = jr.normal(getkey(), (23, 3))
    initial = jr.normal(getkey(), (3,))
    plain, started = jax.jit(
        lambda a, b, initial: (
            ls.linear_scan(a, b, reverse=reverse),
            ls.linear_scan(a, b, reverse=reverse, initial=initial),
        )
    )(a, b, initial)
    np.testing.assert_allclose(plain, _loop(a, b, reverse), atol=1e-5)
    np.testing.assert_allclose(started, _loop(a, b, reverse, initial), atol=1e-5)
    if not dense:  # NumPy in (as `check_grads` passes it); `initial` was `.at`-updated
        from_numpy = ls.linear_scan.__wrapped__(
            *map(np.asarray, (a, b)), reverse=reverse, initial=np.asarray(initial)
        )
        np.testing.assert_allclose(from_numpy, started, atol=1e-6)


def test_linear_scan_complex_reproduces_s4d(getkey):
    """The diagonal complex scan of the S4D state gives the layer's output."""
    layer = ls.S4D(2, state_size=4, key=getkey())
    x = jr.normal(getkey(), (30, 2))

    @eqx.filter_jit
    def run(layer, x):
        abar, cb = layer.kernel.discretize()
        a = jnp.broadcast_to(abar.reshape(-1), (30, abar.size))
        b = jnp.repeat(x, abar.shape[1], axis=1).astype(abar.dtype)
        states = ls.linear_scan(a, b).reshape(30, *abar.shape)
        return 2 * jnp.sum((cb * states).real, -1) + layer.skip * x, layer(x)

    y, out = run(layer, x)
    np.testing.assert_allclose(y, out, atol=1e-5)


def test_linear_scan_grads(getkey):
    a = jr.uniform(getkey(), (6, 2, 2)) * 0.5
    b = jr.normal(getkey(), (6, 2))
    init = jr.normal(getkey(), (2,))
    f = jax.jit(lambda a, b, init: ls.linear_scan(a, b, initial=init, reverse=True))
    check_grads(f, (a, b, init), order=1, modes=["rev"], eps=1e-2, atol=1e-2, rtol=1e-2)


def test_linear_scan_bad_inputs():
    unchecked = ls.linear_scan.__wrapped__  # as called without jaxtyping's import hook
    for scan in (ls.linear_scan, unchecked):
        with pytest.raises((ValueError, TypeError), match="a"):
            scan(jnp.ones((5, 3)), jnp.ones((5, 4)))
        with pytest.raises((ValueError, TypeError), match="initial"):
            scan(jnp.ones((5, 3)), jnp.ones((5, 3)), initial=jnp.ones(4))
    with pytest.raises(ValueError, match=r"a must have shape .*a.shape=\(5,\)"):
        unchecked(jnp.ones(5), jnp.ones((5, 3)))
    with pytest.raises(ValueError, match=r"b must have shape .*b.shape=\(5, 3, 1\)"):
        unchecked(jnp.ones((5, 3)), jnp.ones((5, 3, 1)))
    with pytest.raises(ValueError, match=r"length >= 1.*b.shape=\(0, 3\)"):
        unchecked(jnp.ones((0, 3)), jnp.ones((0, 3)), initial=jnp.ones(3))
    with pytest.raises(TypeError, match="reverse='no'"):
        unchecked(jnp.ones((5, 3)), jnp.ones((5, 3)), reverse="no")
    with pytest.raises(TypeError, match="b must have a floating or complex dtype.*bool"):
        unchecked(jnp.ones((5, 3), bool), jnp.ones((5, 3), bool))
    with pytest.raises(TypeError, match="a must have b's dtype float32.*complex64"):
        unchecked(jnp.ones((5, 3), jnp.complex64), jnp.ones((5, 3)))
    with pytest.raises(TypeError, match="initial must have b's dtype float32.*complex64"):
        unchecked(jnp.ones((5, 3)), jnp.ones((5, 3)), initial=jnp.ones(3, jnp.complex64))


def test_linear_scan_names_non_arrays():
    """`None` (it was an AttributeError) or a list is a `TypeError` naming the argument,
    with jaxtyping's import hook and without."""
    a = b = jnp.ones((5, 3))
    for scan in (ls.linear_scan, ls.linear_scan.__wrapped__):
        for args, name in [((None, b), "a"), ((a, None), "b"), ((a, [[1.0] * 3] * 5), "b")]:
            with pytest.raises(TypeError, match=name):
                scan(*args)
        with pytest.raises(TypeError, match="initial"):
            scan(a, b, initial=[0.0, 0.0, 0.0])
    with pytest.raises(TypeError, match="a must be a JAX or NumPy array, got a=None"):
        ls.linear_scan.__wrapped__(None, b)


# --------------------------------------------------------------------------- experiment


def test_memory_task_batches_and_training_runs(tmp_path):
    from lineax_seq.experiments._s4d import make_batch, train_memory_task

    tokens, target = make_batch(jr.key(0), 16, 40, 8)
    assert tokens.shape == (16, 40)
    keys = tokens != 8
    np.testing.assert_array_equal(keys.sum(1), 1)  # exactly one key, in the first quarter
    assert bool(jnp.all(jnp.argmax(keys, 1) < 10))
    np.testing.assert_array_equal(jnp.max(jnp.where(keys, tokens, -1), 1), target)
    result = train_memory_task(length=32, steps=3, batch=4, out_dir=tmp_path, progress=False)
    assert 0.0 <= result["accuracy"] <= 1.0
    assert (tmp_path / "s4d_kernels.png").exists()


def test_hyena_filter_frequency_from_jax_scalars(getkey):
    """`frequency` may be a JAX scalar, or traced (an ensemble of filters built under
    `filter_vmap` over frequencies)."""
    key = getkey()
    make = lambda f: ls.HyenaFilter(2, order=4, max_length=8, frequency=f, key=key)
    one = make(jnp.float32(5.0))
    np.testing.assert_allclose(one.frequencies[0], 5.0)
    ensemble = eqx.filter_vmap(make)(jnp.array([1.0, 5.0]))
    np.testing.assert_allclose(ensemble.frequencies[0][1], one.frequencies[0])
