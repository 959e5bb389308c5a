"""Attention building blocks: oracles against plain softmax attention and direct T5 buckets."""

import functools
import math
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.test_util
import numpy as np
import pytest
from _devices import needs_cuda

import lineax_seq as ls
from lineax_seq.attention._window import _frame_attention


def softmax_attention(q, k, v, allowed, bias):
    """Plain reference: q (Tq, H, D), k/v (Tk, H, D), allowed (Tq, Tk) or (H, Tq, Tk),
    bias (H, Tq, Tk)."""
    logits = jnp.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1]) + bias
    logits = jnp.where(allowed if allowed.ndim == 3 else allowed[None], logits, -jnp.inf)
    weights = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum("hqk,khd->qhd", weights, v)


def t5_bucket(rel: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """Direct scalar transcription of the T5 bucketing rule."""
    n = -rel
    ret = 0
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            ret += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    large = max_exact + int(
        math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    )
    return ret + min(large, num_buckets - 1)


def test_relative_position_buckets_match_reference_in_other_sizes():
    """Other bucket counts and distances, on exact log boundaries too: with 6 buckets
    (1 exact per direction) and max_distance 100, distance 10 is half-way in log scale,
    and XLA's float32 log put it in the bucket below the formula's."""
    rel = np.arange(-300, 301)
    for num_buckets, max_distance, bidirectional in [
        (6, 100, True),
        (4, 16, False),
        (8, 1000, True),
        (64, 128, False),
        (10, 50, True),
    ]:
        kw = dict(bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
        got = np.asarray(ls.relative_position_bucket(jnp.asarray(rel), **kw))
        want = [t5_bucket(int(r), bidirectional, num_buckets, max_distance) for r in rel]
        np.testing.assert_array_equal(got, want, err_msg=str(kw))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_relative_position_buckets_match_reference(bidirectional):
    rel = np.arange(-400, 401)
    got = np.asarray(ls.relative_position_bucket(jnp.asarray(rel), bidirectional=bidirectional))
    want = np.array([t5_bucket(int(r), bidirectional, 32, 128) for r in rel])
    np.testing.assert_array_equal(got, want)
    assert got.min() >= 0 and got.max() < 32
    # Narrow signed dtypes: int8's -128 negated would wrap to -128.
    narrow = np.arange(-128, 128)
    got = ls.relative_position_bucket(jnp.asarray(narrow, jnp.int8), bidirectional=bidirectional)
    want = [t5_bucket(int(r), bidirectional, 32, 128) for r in narrow]
    np.testing.assert_array_equal(np.asarray(got), want)


def test_relative_position_bias_offset_and_shape(key):
    rpb = ls.RelativePositionBias(3, key=key)
    full = rpb(10, 10)
    assert full.shape == (3, 10, 10)
    # Queries 6..9 against all keys equal the bottom rows of the full matrix.
    np.testing.assert_allclose(rpb(4, 10, query_offset=6), full[:, 6:], rtol=0, atol=0)
    np.testing.assert_allclose(full[:, 5, 2], rpb.embedding[3], rtol=0, atol=0)  # distance 3
    # The table starts small, normal with standard deviation 0.02.
    table = ls.RelativePositionBias(64, key=key).embedding
    assert abs(float(jnp.mean(table))) < 0.002 and 0.018 < float(jnp.std(table)) < 0.022


def test_multi_head_attention_matches_softmax_reference(getkey):
    dim, heads, kv_dim = 12, 3, 5
    mha = ls.MultiHeadAttention(dim, heads, kv_dim=kv_dim, use_bias=True, key=getkey())
    x = jr.normal(getkey(), (7, dim))
    ctx = jr.normal(getkey(), (9, kv_dim))
    mask = jr.bernoulli(getkey(), 0.7, (7, 9)).at[:, 0].set(True)
    bias = jr.normal(getkey(), (heads, 7, 9))

    @eqx.filter_jit
    def both(mha, x, ctx, mask, bias):
        lin = lambda layer, a: a @ layer.weight.T + layer.bias
        split = lambda a: a.reshape(a.shape[0], heads, dim // heads)
        q, k, v = (
            split(lin(mha.query_proj, x)),
            split(lin(mha.key_proj, ctx)),
            split(lin(mha.value_proj, ctx)),
        )
        out = softmax_attention(q, k, v, mask, bias).reshape(7, dim)
        return mha(x, ctx, mask=mask, bias=bias), lin(mha.output_proj, out)

    got, want = both(mha, x, ctx, mask, bias)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_multi_head_attention_gradients(getkey):
    mha = ls.MultiHeadAttention(8, 2, key=getkey())
    x = jr.normal(getkey(), (4, 8))
    mask = jnp.tril(jnp.ones((4, 4), bool))
    f = jax.jit(lambda x: mha(jnp.asarray(x), mask=mask))
    jax.test_util.check_grads(f, (x,), order=1, modes="rev")


def test_multi_head_attention_float64_is_float64(getkey):
    """float64 inputs are attended in float64 (`jax.nn.dot_product_attention` would
    compute float32 logits): the result is a float64 reference's to rounding."""
    with jax.enable_x64(True):
        mha = ls.MultiHeadAttention(8, 2, key=getkey())
        mha = jax.tree.map(lambda a: a.astype(jnp.float64) if eqx.is_inexact_array(a) else a, mha)
        x = jr.normal(getkey(), (5, 8), jnp.float64)
        causal = jnp.tril(jnp.ones((5, 5), bool))
        bias = jr.normal(getkey(), (2, 5, 5), jnp.float64)

        @eqx.filter_jit
        def run(mha, x, bias):
            k, v = mha.keys_values(x)
            # A mask shared by the heads, and one per head (causal / anti-causal).
            return [
                (
                    mha(x, mask=mask, bias=bias),
                    mha.merge_heads(softmax_attention(mha.queries(x), k, v, mask, bias)),
                )
                for mask in (causal, jnp.stack([causal, causal.T]))
            ]

        for got, want in run(mha, x, bias):
            assert got.dtype == jnp.float64
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


def test_multi_head_attention_half_precision_under_jit(getkey):
    """float16 and bfloat16 models run under `jit` (XLA's CPU backend cannot compile the
    float16 product that `jax.nn.dot_product_attention` asks for) and match float32."""
    mha = ls.MultiHeadAttention(16, 2, key=getkey())
    x, mask = jr.normal(getkey(), (6, 16)), jnp.tril(jnp.ones((6, 6), bool))
    want = mha(x, mask=mask)
    for dtype in (jnp.float16, jnp.bfloat16):
        cast = lambda tree, dtype=dtype: jax.tree.map(
            lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, tree
        )
        got = eqx.filter_jit(lambda m, x: m(x, mask=mask))(cast(mha), cast(x))
        assert got.dtype == dtype
        np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=3e-2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_minus_infinity_bias_blocks_like_the_mask(getkey, dtype):
    """`-inf` in `bias` blocks a key as `mask` does, also for a query whose keys are all
    blocked (it was NaN, with NaN gradients everywhere)."""
    mha = ls.MultiHeadAttention(8, 2, key=getkey())
    mha = jax.tree.map(lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, mha)
    x = jr.normal(getkey(), (5, 8)).astype(dtype)
    mask = jnp.ones((5, 5), bool).at[2].set(False).at[:, 4].set(False)
    bias = jnp.where(mask, 0.0, -jnp.inf)[None].repeat(2, 0).astype(dtype)

    @jax.jit
    def run(x):
        loss = lambda x, **kw: jnp.sum(mha(x, **kw).astype(jnp.float32))
        return mha(x, bias=bias), mha(x, mask=mask), jax.grad(lambda x: loss(x, bias=bias))(x)

    with jax.numpy_dtype_promotion("standard"):  # bfloat16 attention promotes inside
        by_bias, by_mask, grad = run(x)
    np.testing.assert_allclose(
        np.asarray(by_bias, np.float32), np.asarray(by_mask, np.float32), rtol=1e-6
    )
    assert np.all(np.isfinite(np.asarray(grad, np.float32)))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_minus_infinity_bias_never_lets_in_a_masked_key(getkey, dtype):
    """A query whose visible keys are all blocked by a `-inf` bias must still not read the
    keys that the mask (or the window) leaves out: future tokens under a causal mask.
    Both were -1e30 in bfloat16 / float64, so such a row averaged every value."""
    with jax.enable_x64(dtype == "float64"), jax.numpy_dtype_promotion("standard"):
        cast = lambda tree: jax.tree.map(
            lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, tree
        )
        mha = cast(ls.MultiHeadAttention(4, 1, key=getkey()))
        x = cast(jr.normal(getkey(), (8, 4)))
        causal = jnp.tril(jnp.ones((8, 8), bool))
        bias = cast(jnp.zeros((1, 8, 8)).at[0, 5, :6].set(-jnp.inf))
        run = lambda x: mha(x, mask=causal, bias=bias)
        changed = run(x.at[6:].add(10.0))  # only keys that row 5's mask leaves out
        np.testing.assert_array_equal(np.asarray(changed[:6]), np.asarray(run(x)[:6]))
        # The row attends to its visible keys alike: the mean of their values.
        values = mha.keys_values(x)[1][:6, 0]
        want = mha.merge_heads(jnp.mean(values, axis=0)[None, None])[0]
        np.testing.assert_allclose(  # (atol: bfloat16's rounding, 4 units apart on a GPU)
            np.asarray(run(x)[5], np.float32), np.asarray(want, np.float32), rtol=2e-2, atol=1e-3
        )

        w = 4  # the same for the window: row 1 of the frame, every in-window key at -inf
        q, k, v = (cast(jr.normal(getkey(), (8, 1, 4))) for _ in range(3))
        visible = ls.sliding_window_mask(w)[1]
        frame_bias = cast(jnp.zeros((1, w, 2 * w)).at[0, 1].set(jnp.where(visible, -jnp.inf, 0)))
        swa = lambda v: ls.sliding_window_attention(q, k, v, window=w, bias=frame_bias)
        for later in (2, 6):  # block 0's row 1 (position 1), block 1's (position 5)
            changed = swa(v.at[later:].add(10.0))
            np.testing.assert_array_equal(np.asarray(changed[:later]), np.asarray(swa(v)[:later]))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_multi_head_attention_fully_masked_row(getkey, dtype):
    """A query that sees no key gets the plain mean of the values, and (float64 added
    the mask to its logits) no gradient through its queries, keys or bias: the function
    does not depend on them."""
    with jax.enable_x64(dtype == "float64"):
        mha = ls.MultiHeadAttention(8, 2, kv_dim=6, key=getkey())
        mha = jax.tree.map(lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, mha)
        x, ctx = jr.normal(getkey(), (4, 8), dtype), jr.normal(getkey(), (5, 6), dtype)
        bias = jr.normal(getkey(), (2, 4, 5), dtype)
        mask = jnp.ones((4, 5), bool).at[2].set(False)
        out = lambda x, bias: mha(x, ctx, mask=mask, bias=bias)[2]

        @jax.jit
        def run(x, bias):
            v = mha.keys_values(ctx)[1]
            mean = mha.merge_heads(v.mean(0)[None])[0]
            # Empty self-attention is empty, not a zero-size reduction error.
            empty = mha(jnp.zeros((0, 8), dtype), jnp.zeros((0, 6), dtype))
            return out(x, bias), mean, jax.jacrev(out, argnums=(0, 1))(x, bias), empty

        row, mean, (grad_x, grad_bias), empty = run(x, bias)
        np.testing.assert_allclose(row, mean, rtol=1e-5)
        assert not np.any(grad_x) and not np.any(grad_bias)
        assert empty.shape == (0, 8)


@pytest.mark.parametrize("window", [1, 3, 4])
def test_sliding_window_attention_matches_dense_reference(getkey, window):
    length, heads, d = 12, 2, 3
    q, k, v = (jr.normal(getkey(), (length, heads, d)) for _ in range(3))
    rpb = ls.RelativePositionBias(heads, key=getkey())

    @eqx.filter_jit
    def both(rpb, q, k, v):
        bias = rpb(window, 2 * window, query_offset=window)
        got = ls.sliding_window_attention(q, k, v, window=window, bias=bias)
        i = np.arange(length)[:, None]
        j = np.arange(length)[None, :]
        allowed = jnp.asarray((i - j >= 0) & (i - j < window))  # the `window` latest tokens
        return got, softmax_attention(q, k, v, allowed, rpb(length, length))

    got, want = both(rpb, q, k, v)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [3, 4])
def test_sliding_window_attention_with_any_frame_bias_matches_block_loop(getkey, window):
    # A bias that is not a function of the relative distance: each (query, key) entry of
    # the block frame is its own, so every query row must read its own frame columns.
    length, heads, d = 4 * window, 2, 3
    q, k, v = (jr.normal(getkey(), (length, heads, d)) for _ in range(3))
    bias = jr.normal(getkey(), (heads, window, 2 * window))

    @jax.jit
    def run(q, k, v, bias):
        # The module and the reference (a loop over blocks) in one compilation.
        wants = []
        for b in range(length // window):
            rows = slice(b * window, (b + 1) * window)
            keys = np.arange((b - 1) * window, (b + 1) * window)
            pos = np.arange(b * window, (b + 1) * window)[:, None]
            allowed = (pos - keys[None] >= 0) & (pos - keys[None] < window) & (keys[None] >= 0)
            kb, vb = k[np.clip(keys, 0, None)], v[np.clip(keys, 0, None)]
            wants.append(softmax_attention(q[rows], kb, vb, jnp.asarray(allowed), bias))
        return ls.sliding_window_attention(q, k, v, window=window, bias=bias), wants

    got, wants = run(q, k, v, bias)
    for b, want in enumerate(wants):
        rows = slice(b * window, (b + 1) * window)
        np.testing.assert_allclose(got[rows], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("blocks", [1, 3])
@pytest.mark.parametrize("with_bias", [False, True])
def test_frame_layout_of_the_fused_path_matches_head_major(getkey, blocks, with_bias):
    # `implementation="cudnn"` hands the blocks to `jax.nn.dot_product_attention` as its
    # batch (block 0 alone, on its own keys). Here XLA runs that layout, on any machine.
    window, heads, d = 4, 2, 8
    q, k, v = (jr.normal(getkey(), (blocks * window, heads, d)) for _ in range(3))
    bias = jr.normal(getkey(), (heads, window, 2 * window)) if with_bias else None
    want = ls.sliding_window_attention(q, k, v, window=window, bias=bias)
    got = _frame_attention(q, k, v, window, bias, implementation="xla")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_attention_implementation_is_checked(key):
    for build in (
        lambda i: ls.MultiHeadAttention(8, 2, implementation=i, key=key),
        lambda i: ls.SlidingWindowAttention(8, 2, 4, implementation=i, key=key),
    ):
        with pytest.raises(
            ValueError,
            match=r"implementation must be one of \(None, 'xla', 'cudnn'\), "
            r"got implementation='flash'",
        ):
            build("flash")
    x = jnp.ones((8, 2, 8))
    with pytest.raises(ValueError, match="implementation='XLA'"):
        ls.sliding_window_attention(x, x, x, window=4, implementation="XLA")
    # cuDNN takes half precision only: float32 is refused by name, on any platform.
    mha = ls.MultiHeadAttention(8, 2, implementation="cudnn", key=key)
    assert mha.implementation == "cudnn"
    with pytest.raises(TypeError, match='implementation="cudnn".*got q.dtype=float32'):
        mha(jnp.ones((4, 8)))
    # Half precision without cuDNN (no NVIDIA GPU): JAX's "cuDNN is not detected", with
    # the option named and the way out.
    if jax.default_backend() == "cpu":
        half = jax.tree.map(lambda a: a.astype(jnp.bfloat16) if eqx.is_inexact_array(a) else a, mha)
        with pytest.raises(RuntimeError, match='implementation="cudnn".*cannot run here.*"xla"'):
            half(jnp.ones((4, 8), jnp.bfloat16))


@needs_cuda
def test_cudnn_attention_matches_xla(getkey):
    length, dim, heads, window = 32, 32, 2, 8
    half = lambda tree: jax.tree.map(
        lambda a: a.astype(jnp.bfloat16) if eqx.is_inexact_array(a) else a, tree
    )
    x = half(jr.normal(getkey(), (length, dim)))
    k = getkey()
    for build in (
        lambda i: ls.MultiHeadAttention(dim, heads, implementation=i, key=k),
        lambda i: ls.SlidingWindowAttention(dim, heads, window, implementation=i, key=k),
    ):
        xla, cudnn = half(build(None)), half(build("cudnn"))
        loss = lambda m, x: jnp.sum(m(x).astype(jnp.float32) ** 2)
        run = eqx.filter_jit(eqx.filter_value_and_grad(loss))
        # (`jax.nn.dot_product_attention` promotes bfloat16 with float32 itself.)
        with jax.numpy_dtype_promotion("standard"):
            want, got = run(xla, x), run(cudnn, x)
        f32 = lambda a: np.asarray(a, np.float32)
        np.testing.assert_allclose(f32(got[0]), f32(want[0]), rtol=3e-2)
        for g, w in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1]), strict=True):
            np.testing.assert_allclose(f32(g), f32(w), rtol=5e-2, atol=5e-2 * np.abs(f32(w)).max())


def test_sliding_window_module_matches_dense_reference(getkey):
    """The module is its projections around plain softmax attention over the `window`
    latest tokens, with its T5 bias at the true distances (the bias table is redrawn
    at scale 1, so that a misplaced or missing bias shows)."""
    layer = ls.SlidingWindowAttention(8, 2, 4, key=getkey())
    table = jr.normal(getkey(), layer.relative_bias.embedding.shape)
    layer = eqx.tree_at(lambda m: m.relative_bias.embedding, layer, table)
    x = jr.normal(getkey(), (16, 8))
    q = layer.attention.queries(x)
    k, v = layer.attention.keys_values(x)
    lag = np.arange(16)[:, None] - np.arange(16)[None, :]
    allowed = jnp.asarray((lag >= 0) & (lag < 4))
    dense = softmax_attention(q, k, v, allowed, layer.relative_bias(16, 16))
    np.testing.assert_allclose(layer(x), layer.attention.merge_heads(dense), rtol=1e-5, atol=1e-5)


def test_sliding_window_module_is_causal(getkey):
    layer = ls.SlidingWindowAttention(8, 2, 4, key=getkey())
    x = jr.normal(getkey(), (16, 8))
    y = layer(x)
    x2 = x.at[9:].set(jr.normal(getkey(), (7, 8)))
    np.testing.assert_allclose(layer(x2)[:9], y[:9], rtol=1e-6, atol=1e-6)
    assert not np.allclose(layer(x2)[9:], y[9:])


def test_attention_bad_input(key):
    with pytest.raises(ValueError, match="num_heads"):
        ls.MultiHeadAttention(10, 3, key=key)
    with pytest.raises(ValueError, match="num_buckets"):
        ls.RelativePositionBias(2, num_buckets=5, bidirectional=True, key=key)
    with pytest.raises(ValueError, match="window=0"):
        ls.SlidingWindowAttention(8, 2, 0, key=key)
    layer = ls.SlidingWindowAttention(8, 2, 4, key=key)
    with pytest.raises(ValueError, match="multiple of `window`=4"):
        layer(jnp.zeros((10, 8)))
    with pytest.raises(ValueError, match="larger than the sequence length"):
        layer(jnp.zeros((2, 8)))
    mha = ls.MultiHeadAttention(8, 2, kv_dim=3, key=key)
    with pytest.raises(ValueError, match="kv_dim=3"):
        mha(jnp.zeros((2, 8)), jnp.zeros((2, 4)))
    with pytest.raises(ValueError, match="self-attention .* kv_dim=3 and dim=8.*`context`"):
        mha(jnp.zeros((2, 8)))
    x, context = jnp.zeros((2, 8)), jnp.zeros((4, 3))
    with pytest.raises(ValueError, match=r"`bias` must have num_heads=2 .*\(3, 2, 4\)"):
        mha(x, context, bias=jnp.zeros((3, 2, 4)))
    with pytest.raises(ValueError, match=r"`mask` must have num_heads=2 .*\(3, 2, 4\)"):
        mha(x, context, mask=jnp.ones((3, 2, 4), bool))
    with pytest.raises(ValueError, match=r"`context` must hold at least one key.*\(0, 3\)"):
        mha(x, jnp.zeros((0, 3)))
    assert mha.__class__(8, 2, key=key)(jnp.zeros((0, 8))).shape == (0, 8)  # no queries
    # The public functions check what the modules check.
    with pytest.raises(ValueError, match="num_buckets"):
        ls.relative_position_bucket(jnp.arange(-4, 4), bidirectional=True, num_buckets=5)
    with pytest.raises(ValueError, match="max_distance"):
        ls.relative_position_bucket(
            jnp.arange(-40, 0), bidirectional=False, num_buckets=32, max_distance=8
        )
    # max_distance must exceed the exact buckets' range (num_buckets / 2, or / 4 when
    # bidirectional): at equality the log-spaced buckets would divide by log(1) = 0.
    for bidirectional, exact in ((False, 16), (True, 8)):
        with pytest.raises(ValueError, match=f"`max_distance` must exceed.*got {exact} "):
            ls.RelativePositionBias(
                2, num_buckets=32, max_distance=exact, bidirectional=bidirectional, key=key
            )
        rpb = ls.RelativePositionBias(
            2, num_buckets=32, max_distance=exact + 1, bidirectional=bidirectional, key=key
        )
        assert bool(jnp.all(jnp.isfinite(rpb(40, 40))))


def test_sliding_window_attention_checks_without_jaxtyping(no_jaxtyping):
    # The annotations reject some of these first when jaxtyping checks.
    q = jnp.zeros((8, 2, 4))
    unchecked = ls.sliding_window_attention
    for window in (2.0, True):
        with pytest.raises(ValueError, match=f"got window={window!r}"):
            ls.SlidingWindowAttention(8, 2, window, key=jr.key(0))
    assert ls.SlidingWindowAttention(8, 2, np.int64(4), key=jr.key(0)).window == 4
    with pytest.raises(ValueError, match="window=0"):
        unchecked(q, q, q, window=0)
    with pytest.raises(ValueError, match=r"\(length, heads, head_dim\), got q.shape=\(8, 4\)"):
        unchecked(q[:, 0], q[:, 0], q[:, 0], window=4)
    with pytest.raises(ValueError, match=r"one shape .* k.shape=\(16, 2, 4\)"):
        unchecked(q, jnp.zeros((16, 2, 4)), q, window=4)
    with pytest.raises(
        ValueError, match=r"`bias` must have shape .*\(2, 4, 8\), got shape \(2, 4, 4\)"
    ):
        unchecked(q, q, q, window=4, bias=jnp.zeros((2, 4, 4)))
    with pytest.raises(TypeError, match="`q` must have a floating dtype.*int32"):
        unchecked(q.astype(jnp.int32), q, q, window=4)


@pytest.mark.parametrize("name", ["q", "k", "v", "bias"])
def test_sliding_window_attention_takes_numpy_and_names_non_arrays(name, getkey):
    """NumPy arrays are arrays, as the hints say (with the import hook and without);
    `None` or a list is a `TypeError` naming the argument (it was an AttributeError)."""
    args = {n: jr.normal(getkey(), (4, 1, 2)) for n in "qkv"}
    args["bias"] = jr.normal(getkey(), (1, 2, 4))
    expected = ls.sliding_window_attention(**args, window=2)
    for attend in (ls.sliding_window_attention, ls.sliding_window_attention.__wrapped__):
        numpy = attend(**{n: np.asarray(a) for n, a in args.items()}, window=2)
        np.testing.assert_allclose(numpy, expected, atol=1e-6)
        with pytest.raises(TypeError, match=name):
            attend(**{**args, name: np.asarray(args[name]).tolist()}, window=2)
        if name != "bias":
            with pytest.raises(TypeError, match=name):
                attend(**{**args, name: None}, window=2)


def test_attention_layers_name_a_batched_input(key, no_jaxtyping):
    """A batch given without `vmap` is named by the layer (it was an einops error)."""
    batched = r"must have shape \(length, .*one example: jax.vmap over a batch\), got shape"
    with pytest.raises(ValueError, match="`x` " + batched):
        ls.MultiHeadAttention(4, 2, key=key)(jnp.ones((2, 8, 4)))
    with pytest.raises(ValueError, match="`context` " + batched):
        ls.MultiHeadAttention(4, 2, key=key)(jnp.ones((8, 4)), jnp.ones((2, 8, 4)))
    with pytest.raises(ValueError, match="`x` " + batched):
        ls.SlidingWindowAttention(4, 2, 4, key=key)(jnp.ones((4, 8, 4)))


def test_projections_one_by_one_check_their_inputs(key, no_jaxtyping):
    """`queries`, `keys_values`, `merge_heads` and `heads` check shapes and dtypes as the
    layers' `__call__` does (a wrong size was a `dot_general` error, integers passed)."""
    mha = ls.MultiHeadAttention(8, 2, kv_dim=6, key=key)
    assert mha.queries(jnp.ones((5, 8))).shape == (5, 2, 4)
    assert mha.keys_values(np.ones((3, 6), np.float32))[0].shape == (3, 2, 4)
    assert mha.merge_heads(jnp.ones((5, 2, 4))).shape == (5, 8)
    bad = [
        (mha.queries, jnp.ones((5, 7)), ValueError, r"`x` must have shape \(length, dim=8\)"),
        (mha.queries, jnp.ones(8), ValueError, r"`x` must have shape .*got shape \(8,\)"),
        (mha.queries, jnp.ones((5, 8), int), TypeError, "x must have a real floating dtype"),
        (mha.keys_values, jnp.ones((3, 8)), ValueError, r"`context` .*\(length, kv_dim=6\)"),
        (mha.merge_heads, jnp.ones((5, 8)), ValueError, r"`out` must have shape \(q, 2, 4\)"),
    ]
    for fn, arg, error, match in bad:
        with pytest.raises(error, match=match):
            fn(arg)
    swa = ls.SlidingWindowAttention(8, 2, 4, key=key)
    assert swa.heads(jnp.ones((8, 8))).shape == (8, 2, 4)
    for arg in (jnp.ones((8, 7)), jnp.ones((6, 8))):
        with pytest.raises(ValueError, match="`x` must"):
            swa.heads(arg)


def test_attention_arguments_checked(key, no_jaxtyping):
    """Sizes, flags and positions are checked where they enter (not by XLA later)."""
    for bad in (True, 2.0):
        with pytest.raises(ValueError, match=f"num_heads={bad!r}"):
            ls.MultiHeadAttention(8, bad, key=key)
        with pytest.raises(ValueError, match=f"num_buckets={bad!r}"):
            ls.RelativePositionBias(2, num_buckets=bad, key=key)
    with pytest.raises(ValueError, match="kv_dim=2.5"):
        ls.MultiHeadAttention(8, 2, kv_dim=2.5, key=key)
    with pytest.raises(TypeError, match="use_bias='no'"):
        ls.MultiHeadAttention(8, 2, use_bias="no", key=key)
    with pytest.raises(TypeError, match="bidirectional='no'"):
        ls.relative_position_bucket(jnp.arange(3), bidirectional="no")
    with pytest.raises(TypeError, match="signed integer.*float32"):
        ls.relative_position_bucket(jnp.array([-1.5, 3.2]), bidirectional=False)
    with pytest.raises(TypeError, match="signed integer.*uint32"):
        ls.relative_position_bucket(jnp.array([3, 50], jnp.uint32), bidirectional=True)
    for window in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match=f"window={window!r}"):
            ls.sliding_window_mask(window)
    rpb = ls.RelativePositionBias(2, key=key)
    with pytest.raises(ValueError, match="query_length=-1"):
        rpb(-1, 3)
    with pytest.raises(TypeError, match="query_offset"):
        rpb(2, 3, query_offset=1.5)
    with pytest.raises(TypeError, match="query_offset"):
        rpb(2, 3, query_offset=jnp.array([0, 1]))
    assert rpb(2, 3, query_offset=jnp.array(1)).shape == (2, 2, 3)
    # Self-attention: the mask and bias must fit (queries, keys) = (x, x).
    mha = ls.MultiHeadAttention(8, 2, key=key)
    x = jnp.ones((5, 8))
    with pytest.raises(ValueError, match=r"`mask` must end in \(queries, keys\)=\(5, 5\)"):
        mha(x, mask=jnp.ones((5, 4), bool))
    with pytest.raises(ValueError, match=r"`bias` must end in \(queries, keys\)=\(5, 5\)"):
        mha(x, bias=jnp.ones((2, 5, 6)))


def _cast(tree, dtype):
    return jax.tree.map(lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, tree)


def test_attention_bias_in_another_float_dtype(getkey):
    """A model cast to bfloat16 as a whole (its relative position bias too) runs under
    strict dtype promotion, as does a float32 layer given a bias of another dtype
    (e.g. a float64 `RelativePositionBias` built under `jax_enable_x64`): the bias is
    added to the float32 logits, as `jax.nn.dot_product_attention` does."""
    mha = ls.MultiHeadAttention(8, 2, key=getkey())
    rpb = ls.RelativePositionBias(2, key=getkey())
    swa = ls.SlidingWindowAttention(8, 2, 4, key=getkey())
    x = jr.normal(getkey(), (8, 8))

    @eqx.filter_jit
    def run(mha, rpb, swa, x):
        bias = rpb(8, 8)
        half = _cast((mha, rpb, swa, x), jnp.bfloat16)
        return (
            (mha(x, bias=bias), half[0](half[3], bias=half[1](8, 8))),
            (swa(x), half[2](half[3])),
            (mha(x, bias=bias), mha(x, bias=bias.astype(jnp.bfloat16))),
        )

    for want, got in run(mha, rpb, swa, x):
        np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=5e-2)
    with jax.enable_x64(True):
        bias = rpb(8, 8).astype(jnp.float64)
        got = eqx.filter_jit(lambda m, x, b: m(x, bias=b))(mha, x, bias)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, run(mha, rpb, swa, x)[0][0], rtol=1e-5, atol=1e-6)


def test_sliding_window_attention_promotes_mixed_inputs(getkey):
    """`q`, `k`, `v` of different dtypes are promoted to one, as `jnp` operations take
    them: the result is the float32 attention of the promoted inputs (a bfloat16 `v` gave
    a bfloat16 result, its softmax weights rounded). Strict promotion refuses the mix."""
    q, k, v = jr.normal(getkey(), (3, 8, 2, 4))
    v_half = v.astype(jnp.bfloat16)
    with jax.numpy_dtype_promotion("standard"):
        got = ls.sliding_window_attention(q, k, v_half, window=4)
    want = ls.sliding_window_attention(q, k, v_half.astype(jnp.float32), window=4)
    assert got.dtype == jnp.float32
    np.testing.assert_array_equal(got, want)
    with pytest.raises(jax.dtypes.TypePromotionError):
        ls.sliding_window_attention(q, k, v_half, window=4)


def test_attention_bias_shared_by_the_heads(getkey):
    """A `(q, k)` bias is every head's, as a `(q, k)` mask is (it was refused)."""
    mha = ls.MultiHeadAttention(8, 2, key=getkey())
    x, context = jr.normal(getkey(), (5, 8)), jr.normal(getkey(), (7, 8))
    bias = jr.normal(getkey(), (5, 7)).at[:, 0].set(-jnp.inf)
    mask = jnp.arange(7) < 6
    shared = mha(x, context, bias=bias, mask=jnp.broadcast_to(mask, (5, 7)))
    per_head = mha(x, context, bias=jnp.stack([bias, bias]), mask=jnp.broadcast_to(mask, (5, 7)))
    np.testing.assert_allclose(shared, per_head, rtol=1e-6, atol=1e-6)
    assert not np.allclose(shared, mha(x, context, mask=jnp.broadcast_to(mask, (5, 7))))


def test_attention_mask_must_be_boolean(getkey, no_jaxtyping):
    """Without jaxtyping's checks, a float mask was read as truthy by the bfloat16 /
    float16 / float64 path (an additive `0 / -inf` mask silently inverted) while float32
    raised JAX's own error: every dtype now names `mask` and its dtype."""
    mha = ls.MultiHeadAttention(8, 2, key=getkey())
    x = jr.normal(getkey(), (4, 8))
    additive = jnp.where(jnp.tril(jnp.ones((4, 4), bool)), 0.0, -jnp.inf)
    for dtype in (jnp.float32, jnp.bfloat16):
        with pytest.raises(TypeError, match="`mask` must be boolean.*mask.dtype=float32"):
            _cast(mha, dtype)(x.astype(dtype), mask=additive)


def test_relative_position_bucket_names_a_list(no_jaxtyping):
    """A list failed in `jnp.result_type` ("Cannot determine dtype"), naming nothing."""
    with pytest.raises(TypeError, match=r"relative_position must be a JAX or NumPy array"):
        ls.relative_position_bucket([1, -2, 3], bidirectional=False)


def test_positions_beyond_int32_are_named_not_wrapped(key, no_jaxtyping):
    """int64 host positions were cast to int32 silently: 2**33 took the bucket of 0, an
    offset of 2**32 + 1 that of 1; a Python offset of 2**31 failed inside JAX."""
    bucket = functools.partial(ls.relative_position_bucket, bidirectional=True)
    np.testing.assert_array_equal(bucket(np.array([200, -200, 5])), [31, 15, 21])
    with pytest.raises(ValueError, match=r"relative_position.*int32.*\[-8589934592, 8589934592\]"):
        bucket(np.array([2**33, -(2**33), 5]))
    rb = ls.RelativePositionBias(2, key=key)
    np.testing.assert_array_equal(
        rb.buckets(2, 3, query_offset=np.int64(5)), rb.buckets(2, 3, query_offset=5)
    )
    for offset in (np.int64(2**32 + 1), 2**31):
        with pytest.raises(ValueError, match=re.escape(f"query_offset={offset!r}")):
            rb.buckets(2, 3, query_offset=offset)
    # Narrow host dtypes are widened as JAX widens them; negative offsets are checked too.
    np.testing.assert_array_equal(
        bucket(np.array([-128, 3], np.int8)), bucket(jnp.array([-128, 3]))
    )
    with pytest.raises(ValueError, match=re.escape("query_offset=-2147483646")):
        rb.buckets(1, 4, query_offset=-(2**31) + 2)
