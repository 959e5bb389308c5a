"""Oracle tests for `chunked_conv`, the FFT-free exact SSM convolution, and S4D's `conv`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from jax.test_util import check_grads

import lineax_seq as ls
from lineax_seq.ssm._chunked import _default_chunk

CHANNELS = 4
LENGTH = 45  # odd
CHUNKS = (7, 9, 500, None)  # ragged last chunk, a divisor of LENGTH, > LENGTH, default


def _direct(u, k, reverse):
    """O(L^2) direct convolution in float64: causal `sum_{s<=t} k[t-s] u[s]`, or
    anti-causal `sum_{s>=t} k[s-t] u[s]`."""
    u = np.asarray(u, np.float64)
    length = u.shape[0]
    k = np.broadcast_to(np.asarray(k, np.float64), (u.shape[1], length))
    lag = np.arange(length)[:, None] - np.arange(length)[None, :]  # t - s
    lag = -lag if reverse else lag
    toeplitz = np.where(lag >= 0, k[:, np.clip(lag, 0, None)], 0.0)  # (c, t, s)
    return np.einsum("cts,sc->tc", toeplitz, u)


@pytest.fixture(scope="module")
def systems():
    kernels = {kc: ls.S4DKernel(8, kc, init="inv", key=jr.key(kc)) for kc in (1, CHANNELS)}
    return {kc: (kern, *kern.discretize()) for kc, kern in kernels.items()}


@pytest.mark.parametrize("kc", [1, CHANNELS], ids=["shared", "per_channel"])
def test_chunked_conv_equals_direct_and_fft(systems, kc):
    kern, abar, cb = systems[kc]
    length = LENGTH
    u = jr.normal(jr.key(kc), (length, CHANNELS))
    skip = jr.normal(jr.key(5), (kc,))

    @jax.jit
    def run(u, abar, cb, skip):
        out = [
            [ls.chunked_conv(u, abar, cb, skip, reverse=rev, chunk=chunk) for chunk in CHUNKS]
            for rev in (False, True)
        ]
        k = kern(length).at[:, 0].add(skip)
        fft = {False: ls.fft_conv(u, k), True: ls.fft_conv(u[::-1], k)[::-1]}
        return out, fft, k

    out, fft, k = run(u, abar, cb, skip)
    for rev in (False, True):
        direct = _direct(u, k, rev)
        scale = np.abs(direct).max()
        np.testing.assert_allclose(fft[rev], direct, atol=1e-5 * scale)
        for chunk, y in zip(CHUNKS, out[rev], strict=True):
            assert y.shape == (length, CHANNELS) and y.dtype == jnp.float32
            np.testing.assert_allclose(y, direct, atol=1e-5 * scale, err_msg=f"{chunk} {rev}")
            np.testing.assert_allclose(y, fft[rev], atol=1e-5 * scale)


def test_chunked_conv_traced_direction_dtype_and_causality(systems):
    """`reverse` as a traced boolean (vmap over directions) equals the static calls;
    a bfloat16 input gives a bfloat16 output; changing the future (past) does not
    change a causal (anti-causal) output."""
    _, abar, cb = systems[CHANNELS]
    u = jr.normal(jr.key(0), (2, 45, CHANNELS))

    @jax.jit
    def run(u):
        batched = jax.vmap(lambda u, r: ls.chunked_conv(u, abar, cb, reverse=r, chunk=8))(
            u, jnp.array([False, True])
        )
        static = [ls.chunked_conv(u[i], abar, cb, reverse=bool(i), chunk=8) for i in (0, 1)]
        half = ls.chunked_conv(u[0].astype(jnp.bfloat16), abar, cb, chunk=8)
        return batched, static, half

    batched, static, half = run(u)
    np.testing.assert_allclose(batched[0], static[0], atol=1e-6)
    np.testing.assert_allclose(batched[1], static[1], atol=1e-6)
    assert half.dtype == jnp.bfloat16
    np.testing.assert_allclose(half.astype(jnp.float32), static[0], rtol=0.05, atol=0.05)
    changed = u.at[0, 20:].add(1.0).at[1, :20].add(1.0)
    again = run(changed)[0]
    np.testing.assert_allclose(again[0, :20], batched[0, :20], atol=1e-6)
    np.testing.assert_allclose(again[1, 20:], batched[1, 20:], atol=1e-6)
    assert not np.allclose(again[0, 20:], batched[0, 20:])


def test_chunked_conv_grads(getkey):
    kern = ls.S4DKernel(4, 2, key=getkey())
    params, static = eqx.partition(kern, eqx.is_array)
    u = jr.normal(getkey(), (8, 2))

    @jax.jit
    def f(p, u):
        abar, cb = eqx.combine(p, static).discretize()
        y = ls.chunked_conv(u, abar, cb, chunk=3) + ls.chunked_conv(
            u, abar, cb, reverse=True, chunk=3
        )
        return jnp.sum(jnp.sin(y))

    check_grads(f, (params, u), order=1, modes=["rev"], eps=1e-3, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    "length, kc, modes, chunk",
    [
        (512, 1, 32, 512),  # shared, wide state: one dense product up to 2 x 256
        (513, 1, 32, 256),
        (256, 1, 8, 256),  # shared, narrow state: one dense product up to 2 x 128
        (257, 1, 8, 128),
        (65536, 1, 8, 128),  # no growth with length
        (100, 4, 32, 64),  # per channel
        (9000, 4, 32, 128),
        (9000, 4, 8, 64),
        (5, 4, 8, 5),  # never more than the length
    ],
)
def test_default_chunk(length, kc, modes, chunk):
    """The documented default chunk sizes of `chunked_conv`."""
    assert _default_chunk(length, kc, modes) == chunk


def test_chunked_conv_bad_inputs(systems):
    _, abar, cb = systems[CHANNELS]
    u = jnp.ones((10, CHANNELS))
    with pytest.raises(ValueError, match="chunk must be a positive integer.*chunk=0"):
        ls.chunked_conv(u, abar, cb, chunk=0)
    with pytest.raises((ValueError, TypeError), match="abar"):
        ls.chunked_conv(jnp.ones((10, 3)), abar, cb)  # 4 systems for 3 channels
    with pytest.raises((ValueError, TypeError), match="cb"):
        ls.chunked_conv(u, abar, cb[:, :2])
    with pytest.raises((ValueError, TypeError), match="skip"):
        ls.chunked_conv(u, abar, cb, jnp.ones(3))
    with pytest.raises((ValueError, TypeError), match="u"):
        ls.chunked_conv(jnp.ones((2, 10, CHANNELS)), abar, cb)
    for reverse in ("yes", jnp.array(0.5), jnp.array([True, False])):
        with pytest.raises(TypeError, match="reverse"):  # jaxtyping's, or ours without it
            ls.chunked_conv(u, abar, cb, reverse=reverse)


def test_chunked_conv_checks_system_shapes_without_jaxtyping(systems, no_jaxtyping):
    """One shared `abar` with per-channel `cb` would silently use `cb[0]` only."""
    _, abar, cb = systems[CHANNELS]
    with pytest.raises(
        ValueError, match=rf"cb must have the shape of abar=\(1, 4\).*\({CHANNELS}, 4\)"
    ):
        ls.chunked_conv(jnp.ones((10, CHANNELS)), abar[:1], cb)
    with pytest.raises(
        ValueError, match=rf"abar must have shape \(kc, modes\).*channels={CHANNELS}"
    ):
        ls.chunked_conv(jnp.ones((10, CHANNELS)), abar[:2], cb[:2])


def test_chunked_conv_refuses_a_complex_skip(systems, no_jaxtyping):
    """`D` is real: a complex one's imaginary part used to be dropped silently (the
    annotations refuse it first when jaxtyping checks)."""
    _, abar, cb = systems[CHANNELS]
    for dtype in (jnp.complex64, jnp.int32):
        with pytest.raises(
            TypeError, match=f"skip must have a real floating dtype.*{dtype.__name__}"
        ):
            ls.chunked_conv(jnp.ones((10, CHANNELS)), abar, cb, jnp.ones(abar.shape[0], dtype))


# ------------------------------------------------------------------ S4D's conv option


def test_s4d_conv_methods_agree(getkey):
    """`conv="chunked"` and `conv="fft"` give the same layer (per-channel and shared
    kernels, causal and bidirectional; the shared causal layer's `"auto"` is chunked)."""
    configs = [
        dict(),
        dict(channels=1),
        dict(bidirectional=True),
        dict(channels=1, bidirectional=True, init="legs"),
    ]
    keys = [getkey() for _ in configs]
    layers = [
        [ls.S4D(3, state_size=6, conv=conv, key=k, **c) for conv in ("fft", "chunked", "auto")]
        for c, k in zip(configs, keys, strict=True)
    ]
    x = jr.normal(getkey(), (300, 3))  # shared: chunks of 128 (ragged); per channel: of 64

    @eqx.filter_jit
    def run(layers, x):
        return [[m(x) for m in ms] for ms in layers]

    for config, (fft, chunked, auto) in zip(configs, run(layers, x), strict=True):
        scale = float(jnp.abs(fft).max())
        np.testing.assert_allclose(chunked, fft, atol=2e-5 * scale, err_msg=str(config))
        np.testing.assert_allclose(auto, fft, atol=2e-5 * scale, err_msg=str(config))
    assert layers[0][2].conv == "auto"
    with pytest.raises((ValueError, TypeError), match="conv"):
        ls.S4D(3, conv="fast", key=getkey())


def test_s4d_chunked_slow_modes_float32_accuracy():
    """Slow modes (dt Re A ~ -5e-5): the chunked layer starts from `log Abar = dt A`, not
    from `log(exp(dt A))` rounded to float32 (which is off by ~1e-3 relative and gave
    errors of 4e-5 here), so it is as accurate as the FFT of the exact kernel."""
    length = 4096
    layer = ls.S4D(2, channels=1, dt_min=1e-4, dt_max=1e-3, key=jr.key(0))
    layer = eqx.tree_at(lambda m: m.skip, layer, jnp.zeros(2))  # the convolution alone
    u = np.random.default_rng(0).normal(size=(length, 2))
    kern = layer.kernel
    f64 = lambda a: np.asarray(a, np.float64)
    dt_a = np.exp(f64(kern.log_dt))[:, None] * (
        -np.exp(f64(kern.log_neg_real_a)) + 1j * f64(kern.imag_a)
    )
    a = dt_a / np.exp(f64(kern.log_dt))[:, None]
    cb = (f64(kern.c_real) + 1j * f64(kern.c_imag)) * np.expm1(dt_a) / a  # B = 1, zoh
    k = 2 * np.real(np.exp(np.arange(length)[:, None] * dt_a[0]) @ cb[0])
    n = 2 * length
    want = np.fft.irfft(np.fft.rfft(u, n, axis=0) * np.fft.rfft(k, n)[:, None], n, axis=0)
    want = want[:length]
    got = eqx.filter_jit(lambda m, u: m(u))(layer, jnp.asarray(u, jnp.float32))
    np.testing.assert_allclose(got, want, atol=5e-6 * np.abs(want).max())


# ------------------------------------------------------- BST ContextSSM block ends


@pytest.mark.parametrize(("ssm", "window"), [("s4", 8), ("s4", 5), ("unstruct", 8)])
def test_context_ssm_block_ends_equal_full_output(ssm, window, getkey):
    """`block_ends` (block-end states, no full convolution, for "s4") equals the full
    output at every window's last position; bad windows are rejected."""
    from lineax_seq.bst._ssm import ContextSSM

    module = ContextSSM(6, 3, 2, ssm=ssm, state_size=4, max_length=40, key=getkey())
    x = jr.normal(getkey(), (40, 6))
    full, ends = eqx.filter_jit(lambda m, x: (m(x), m.block_ends(x, window)))(module, x)
    assert ends.shape == (40 // window, 2, 3)
    np.testing.assert_allclose(ends, full[window - 1 :: window], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="multiple of window=7"):
        module.block_ends(x, 7)
    # Same dtype as the full output (bfloat16 inputs meet float32 weights: float32).
    with jax.numpy_dtype_promotion("standard"):
        xb = x.astype(jnp.bfloat16)
        ends, full = eqx.filter_jit(lambda m, x: (m.block_ends(x, window), m(x)))(module, xb)
        assert ends.dtype == full.dtype == jnp.float32


def test_context_ssm_block_ends_accurate_over_long_sequences(getkey):
    """Block ends over 32 blocks of 512 agree with the full output to float32 rounding:
    powers `Abar^e` from repeated products compounded their rounding (1e-5 relative)."""
    from lineax_seq.bst._ssm import ContextSSM

    length, window = 16_384, 512
    module = ContextSSM(8, 4, 1, ssm="s4", state_size=16, key=getkey())
    x = jr.normal(getkey(), (length, 8))
    full, ends = eqx.filter_jit(lambda m, x: (m(x), m.block_ends(x, window)))(module, x)
    want = np.asarray(full[window - 1 :: window])
    np.testing.assert_allclose(ends, want, atol=2e-6 * np.abs(want).max())


@pytest.mark.parametrize("streams", [1, 3])
def test_context_ssm_equals_direct_convolution(streams, getkey):
    """One stream (SH, by `chunked_conv`) and several (MH / MF, one shared FFT of the
    input) give the direct causal sum with each channel's kernel, plus the skip."""
    from lineax_seq.bst._ssm import ContextSSM

    length, features = 300, 4  # SH: one kernel per channel, chunks of 64 (the last ragged)
    module = ContextSSM(6, features, streams, ssm="s4", state_size=4, key=getkey())
    x = jr.normal(getkey(), (length, 6))
    got = eqx.filter_jit(lambda m, x: m(x))(module, x)
    u = np.tile(np.asarray(x @ module.down.weight.T + module.down.bias), (1, streams))
    want = _direct(u, module.kernel(length), reverse=False) + np.asarray(module.skip) * u
    want = want.reshape(length, streams, features)  # channel s * features + f
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_chunked_conv_zero_abar():
    """`Abar = 0` (`exp(dt A)` underflowed) is a valid system: its kernel is `2 CB` at lag
    0 and nothing after, for the chunked path as for the FFT path."""
    abar = jnp.array([[0.5 + 0j, 0j]])
    cb = jnp.array([[1 + 0j, 1 + 0j]])
    u = jr.normal(jr.key(0), (21, 1))
    k = 2 * (0.5 ** np.arange(21) + (np.arange(21) == 0))

    @jax.jit
    def run(u, abar, cb):
        # Both directions and the gradient in one compilation.
        ys = [ls.chunked_conv(u, abar, cb, reverse=reverse, chunk=4) for reverse in (False, True)]
        loss = lambda a: ls.chunked_conv(u, a, cb, chunk=4).sum()
        return ys, jax.grad(loss, holomorphic=False)(abar)

    ys, grads = run(u, abar, cb)
    for reverse, y in zip((False, True), ys, strict=True):
        np.testing.assert_allclose(y, _direct(u, k, reverse), atol=1e-5)
    assert jnp.isfinite(grads).all()


def test_s4d_fully_decayed_modes_agree(getkey):
    """A layer whose every `Abar` underflows to 0 (`dt |Re A|` > 104) gives the same
    finite output with either convolution."""
    x = jr.normal(getkey(), (40, 3))
    key = getkey()
    make = lambda conv: ls.S4D(
        3, state_size=256, channels=1, init="real", dt_min=0.9, dt_max=1.0, conv=conv, key=key
    )
    fft, chunked = make("fft"), make("chunked")
    assert (fft.kernel.discretize()[0] == 0).any()
    outputs = eqx.filter_jit(lambda layers, x: [layer(x) for layer in layers])
    got_chunked, got_fft = outputs((chunked, fft), x)
    np.testing.assert_allclose(got_chunked, got_fft, atol=1e-5)
