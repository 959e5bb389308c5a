"""BiGS layers, encoder and heads: oracles against the paper's equations, padding
exactness, the four ablation variants, heads, checkpoints, lengths and bad inputs.

Compile time dominates, so every module is built (and perturbed) in one jitted
fixture, and each test compiles one function."""

import functools
import json
import warnings

import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
import pytest
import scipy.special
from _devices import assert_check_fails
from jax.test_util import check_grads

import lineax_seq as ls
from lineax_seq.bigs import _ssm
from lineax_seq.ssm._chunked import _default_chunk

VARIANTS = ["gated/ssm", "stack/ssm", "gated/attention", "stack/attention"]
VOCAB, DIM = 50, 16

# ----------------------------------------------------------------- slow references


def f64(a):
    return np.asarray(a, np.float64)


def ref_ln(norm, x):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + norm.eps) * f64(norm.weight) + f64(norm.bias)


def ref_gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def ref_exact_gelu(x):
    return 0.5 * x * (1 + scipy.special.erf(x / np.sqrt(2)))


def ref_dense(lin, x):
    return x @ f64(lin.weight).T + (0 if lin.bias is None else f64(lin.bias))


def ref_kernel(ssm, length):
    """K[c, l] = 2 Re(sum_n CB[c, n] Abar[c, n]^l), from the discretised system."""
    abar, cb = ssm.kernel_fn.discretize()
    abar, cb = np.asarray(abar, np.complex128), np.asarray(cb, np.complex128)
    powers = abar[:, :, None] ** np.arange(length)[None, None, :]
    return 2 * np.real(np.einsum("cn,cnl->cl", cb, powers))


def ref_ssm(ssm, u):
    """The paper's SSM(u): causal, y[t] = sum_{j <= t} K[t - j] u[j] + D u[t] (a loop)."""
    length, dim = u.shape
    k = np.broadcast_to(ref_kernel(ssm, length), (dim, length))
    y = np.zeros_like(u)
    for t in range(length):
        for j in range(t + 1):
            y[t] += k[:, t - j] * u[j]
    return y + f64(ssm.d) * u


def ref_attention(mha, x):
    """Softmax self-attention over all positions, heads concatenated, optional W_o."""
    heads, hd = mha.num_heads, mha.head_dim
    split = lambda a: a.reshape(a.shape[0], heads, hd).transpose(1, 0, 2)
    q, k, v = (split(ref_dense(p, x)) for p in (mha.query_proj, mha.key_proj, mha.value_proj))
    logits = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    o = ((p / p.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(x.shape[0], -1)
    return o if mha.output_proj is None else ref_dense(mha.output_proj, o)


def ref_route(routing, x):
    return (
        ref_attention(routing, x)
        if isinstance(routing, ls.MultiHeadAttention)
        else (ref_ssm(routing, x))
    )


def ref_gated(layer, x):
    """Section 3 of the paper, with explicit Flips (the module never flips)."""
    flip = lambda a: a[::-1]
    h = ref_ln(layer.norm, x)
    v = ref_gelu(ref_dense(layer.v_proj, h))
    f = ref_gelu(ref_dense(layer.f_proj, h))
    b = ref_gelu(ref_dense(layer.b_proj, flip(h)))
    u1 = ref_dense(layer.u1_proj, ref_route(layer.forward_routing, f))
    u2 = ref_dense(layer.u2_proj, ref_route(layer.backward_routing, b))
    u = ref_gelu(ref_dense(layer.u_proj, u1 * flip(u2)))
    return x + ref_dense(layer.out_proj, u * v)


def ref_stack(layer, x):
    """STACK/SSM (forward block, then Flip . SSM . Flip block) or BERT, then the MLP."""
    if layer.routing == "ssm":
        fwd, bwd = layer.routing_blocks
        h = ref_dense(fwd.in_proj, ref_ln(fwd.norm, x))
        x = x + ref_dense(fwd.out_proj, ref_gelu(ref_ssm(fwd.ssm, h)))
        h = ref_dense(bwd.in_proj, ref_ln(bwd.norm, x))
        x = x + ref_dense(bwd.out_proj, ref_gelu(ref_ssm(bwd.ssm, h[::-1])[::-1]))
    else:
        (block,) = layer.routing_blocks
        x = x + ref_attention(block.attention, ref_ln(block.norm, x))
    h = ref_gelu(ref_dense(layer.mlp_in, ref_ln(layer.mlp_norm, x)))
    return x + ref_dense(layer.mlp_out, h)


# ----------------------------------------------------------------------- fixtures


def _random_params(abstract, seed, scale=0.3):
    """Materialise an abstract module (`eqx.filter_eval_shape`) with random weights.

    Compiling the constructors costs seconds per model on CPU, and BERT's 0.02 init
    makes a layer almost the identity (weak oracle and padding tests): every float
    leaf is `N(0, scale^2)`, except the S4D ones, which get a stable, long-memory
    system (`A = -1/2 + i pi n` perturbed, `dt` in `[1e-3, 1e-1]`, `B` near 1)."""
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        if not isinstance(leaf, jax.ShapeDtypeStruct):
            return leaf
        noise = scale * rng.standard_normal(leaf.shape)
        name = getattr(path[-1], "name", None)
        if name == "log_neg_real_a":
            noise += np.log(0.5)
        elif name == "imag_a":
            noise += np.pi * np.arange(leaf.shape[-1])
        elif name == "b_real":
            noise += 1.0
        elif name == "log_dt":
            noise = rng.uniform(np.log(1e-3), np.log(1e-1), leaf.shape)
        return jnp.asarray(noise, leaf.dtype)

    return jax.tree_util.tree_map_with_path(fill, abstract)


@pytest.fixture(scope="module")
def mods():
    """Every module of the file, with random weights (see `_random_params`)."""
    makers = dict(
        gated=lambda k: ls.GatedLayer(8, inner_dim=20, key=k),
        gated_att=lambda k: ls.GatedLayer(8, inner_dim=12, routing="attention", num_heads=2, key=k),
        stack_ssm=lambda k: ls.StackLayer(8, routing="ssm", key=k),
        bert=lambda k: ls.StackLayer(8, routing="attention", num_heads=2, key=k),
        fwd=lambda k: ls.DirectionalSSM(5, key=k),
        bwd=lambda k: ls.DirectionalSSM(5, reverse=True, key=k),
        bwd_per_channel=lambda k: ls.DirectionalSSM(5, reverse=True, kernel="per_channel", key=k),
        cls=lambda k: ls.SequenceClassificationHead(DIM, 3, dropout=0.1, key=k),
        span=lambda k: ls.SpanExtractionHead(DIM, key=k),
        mc=lambda k: ls.MultipleChoiceHead(DIM, dropout=0.1, key=k),
        mlm=lambda k: ls.MaskedLMHead(DIM, VOCAB, key=k),
    )
    for v in VARIANTS:
        a, r = v.split("/")
        makers[v] = lambda k, a=a, r=r: ls.BiGS(
            VOCAB, DIM, 2, architecture=a, routing=r, num_heads=2, dropout=0.1, key=k
        )
    return {
        name: _random_params(eqx.filter_eval_shape(make, jr.key(0)), seed)
        for seed, (name, make) in enumerate(makers.items())
    }


@eqx.filter_jit
def encode(model, tokens, mask=None):
    return model(tokens, mask, inference=True)


# ----------------------------------------------------------------------- oracles


def test_layers_match_paper_equations(mods, getkey):
    """GATED/SSM (= BiGS), GATED/ATT, STACK/SSM and BERT against the equations."""
    names = ("gated", "gated_att", "stack_ssm", "bert")
    x = jr.normal(getkey(), (11, 8))
    got = eqx.filter_jit(lambda ls_, x: [layer(x) for layer in ls_])([mods[n] for n in names], x)
    refs = (ref_gated, ref_gated, ref_stack, ref_stack)
    for name, ref, out in zip(names, refs, got, strict=True):
        np.testing.assert_allclose(out, ref(mods[name], f64(x)), atol=1e-4, err_msg=name)


# Three chunks (the last one ragged) at the default state size 64 (32 complex modes).
CHUNKED_LENGTH = 2 * _default_chunk(10**6, 1, 32) + 13


@pytest.mark.parametrize("length", [9, CHUNKED_LENGTH])
def test_directional_ssm_matches_loop(mods, length, getkey):
    """Every convolution path: shared kernels by one Toeplitz product (short) or by
    chunks (long, 3 chunks here), per-channel kernels by FFT; forward = SSM and
    backward = Flip . SSM . Flip."""
    names = ("fwd", "bwd", "bwd_per_channel")
    u = jr.normal(getkey(), (length, 5))
    got = eqx.filter_jit(lambda ms, u: [m(u) for m in ms])([mods[n] for n in names], u)
    u64 = f64(u)
    want = (
        ref_ssm(mods["fwd"], u64),
        ref_ssm(mods["bwd"], u64[::-1])[::-1],
        ref_ssm(mods["bwd_per_channel"], u64[::-1])[::-1],
    )
    for name, out, ref in zip(names, got, want, strict=True):
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4, err_msg=name)


def test_chunked_conv_chunk_sizes(mods, getkey):
    """The chunked path (causal and anti-causal) with several chunk sizes (incl. a
    ragged last chunk) against the FFT convolution of the same kernels."""
    u = jr.normal(getkey(), (2, 100, 3))

    @eqx.filter_jit
    def run(fwd, bwd, u):
        systems = [m.kernel_fn._discretize() for m in (fwd, bwd)]
        log_abar = jnp.concatenate([a for a, _ in systems])
        cb = jnp.concatenate([c for _, c in systems])
        d = jnp.concatenate([fwd.d, bwd.d])
        k = jnp.stack([fwd.impulse_response(100), bwd.impulse_response(100)])
        fft = jnp.stack([ls.fft_conv(u[0], k[0]), ls.fft_conv(u[1, ::-1], k[1])[::-1]])
        chunked = {
            chunk: _ssm.chunked_ssm_conv(u, log_abar, cb, d, reverse=(False, True), chunk=chunk)
            for chunk in (7, 32, 100)
        }
        return fft, chunked

    fft, chunked = run(mods["fwd"], mods["bwd"], u)
    for chunk, out in chunked.items():
        np.testing.assert_allclose(out, fft, rtol=1e-4, atol=1e-4, err_msg=str(chunk))


def test_directional_ssm_gradients(mods, getkey):
    """Through the Toeplitz gather and the kernel's parameters."""
    ssm = mods["fwd"]
    set_c = lambda c: eqx.tree_at(lambda s: s.kernel_fn.c_real, ssm, c)
    f = jax.jit(lambda u, c: set_c(c)(u))
    u = jr.normal(getkey(), (7, 5))
    check_grads(f, (u, ssm.kernel_fn.c_real), order=1, modes=("rev",), atol=5e-2, rtol=5e-2)


def test_layer_gradients_match_finite_differences():
    """Reverse-mode gradients of the four layer kinds (GELUs recomputed in the backward
    pass, both SSM directions, masked attention), in the input and every parameter,
    against central differences in float64, with trailing padding masked out. Weights as
    `_random_params` draws them: at the 0.02 init every path but the residual is ~1e-4."""
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        build = lambda: [
            ls.GatedLayer(6, inner_dim=10, key=jr.key(0)),
            ls.GatedLayer(6, inner_dim=8, routing="attention", num_heads=2, key=jr.key(1)),
            ls.StackLayer(6, routing="ssm", key=jr.key(2)),
            ls.StackLayer(6, routing="attention", num_heads=2, key=jr.key(3)),
        ]
        layers = _random_params(eqx.filter_eval_shape(build), seed=5)
        params, static = eqx.partition(layers, eqx.is_inexact_array)
        flat, unravel = jax.flatten_util.ravel_pytree(params)
        assert flat.dtype == jnp.float64
        mask = jnp.arange(9) < 7

        @jax.jit
        def outputs(flat, x):
            return [m(x, mask, inference=True) for m in eqx.combine(unravel(flat), static)]

        x = jr.normal(jr.key(4), (9, 6), jnp.float64)
        check_grads(outputs, (flat, x), order=1, modes=("rev",), eps=1e-6)


# -------------------------------------------------------------------- the encoder


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_invariance(mods, variant):
    """Real positions ignore the content (bitwise) and the amount (to rounding: the
    matrix sizes differ) of trailing padding; a model without the mask would not."""
    model = mods[variant]
    n = 9
    real = jr.randint(jr.key(3), (n,), 0, VOCAB)
    pads = jr.randint(jr.key(4), (2, 21), 0, VOCAB)
    tokens = jnp.concatenate([jnp.stack([real, real]), pads], axis=1)  # (2, 30)

    @jax.jit
    def run(tokens):
        unpadded = model(tokens[0, :n], inference=True)
        mask = jnp.arange(30) < n
        padded = jax.vmap(lambda t: model(t, mask, inference=True))(tokens)
        short = model(tokens[1, :16], mask[:16], inference=True)
        leaky = jax.vmap(lambda t: model(t, inference=True))(tokens)
        return unpadded, padded, short, leaky

    unpadded, padded, short, leaky = run(tokens)
    np.testing.assert_array_equal(padded[0, :n], padded[1, :n])  # content: exact
    np.testing.assert_allclose(padded[0, :n], unpadded, rtol=0, atol=1e-5)  # amount 21
    np.testing.assert_allclose(short[:n], unpadded, rtol=0, atol=1e-5)  # amount 7
    assert jnp.all(padded[:, n:] == 0) and jnp.all(short[n:] == 0)
    # Sanity check that the test can fail: unmasked, the pads change real outputs.
    assert float(jnp.max(jnp.abs(leaky[0, :n] - leaky[1, :n]))) > 1e-3
    # A layer called directly: any padded hidden states, NaN too (attention read them
    # as NaN values; every routing's parameter gradients were NaN).
    layer, mask = model.layer(0), jnp.arange(16) < n
    params, static = eqx.partition(layer, eqx.is_inexact_array)

    @jax.jit
    def real_loss_and_grads(h):
        loss = lambda p: jnp.sum(eqx.combine(p, static)(h, mask, inference=True)[:n] ** 2)
        return jax.value_and_grad(loss)(params)

    h = jr.normal(jr.key(5), (16, DIM))
    want, _ = real_loss_and_grads(h)
    got, grads = real_loss_and_grads(h.at[n:].set(jnp.nan))
    assert got == want
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("variant", VARIANTS)
def test_variants_train_one_step(mods, variant):
    model, head = mods[variant], mods["mlm"]
    tokens = jr.randint(jr.key(1), (2, 12), 0, VOCAB)
    mask = jnp.arange(12)[None] < jnp.array([[12], [8]])

    def loss_fn(params, key):
        enc, head = params
        keys = jr.split(key, 2)
        h = jax.vmap(lambda t, m, k: enc(t, m, key=k))(tokens, mask, keys)
        logits = jax.vmap(head, in_axes=(0, None))(h, enc.token_embedding.weight)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, tokens)
        return jnp.sum(jnp.where(mask, ce, 0)) / jnp.sum(mask).astype(ce.dtype)

    params = (model, head)
    opt = optax.adam(1e-3)

    @eqx.filter_jit
    def step(params, state, key):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(params, key)
        updates, state = opt.update(grads, state)
        return eqx.apply_updates(params, updates), state, loss

    key = jr.key(2, impl="unsafe_rbg")  # dropout masks; the default PRNG compiles slowly
    with jax.numpy_dtype_promotion("standard"):  # optax's bias correction mixes dtypes
        state = opt.init(eqx.filter(params, eqx.is_inexact_array))
        params, state, loss0 = step(params, state, key)
        _, _, loss1 = step(params, state, key)
    assert jnp.isfinite(loss0) and loss1 < loss0


def test_lengths_128_and_4096_same_weights(mods):
    """The same weights at 128 and 4,096 tokens (the FFT path); padding exact there too."""
    model = mods["gated/ssm"]
    tokens = jr.randint(jr.key(0), (4096,), 0, VOCAB)
    short = encode(model, tokens[:128])
    long = encode(model, tokens, jnp.arange(4096) < 128)
    assert long.shape == (4096, DIM) and jnp.all(jnp.isfinite(long))
    np.testing.assert_allclose(long[:128], short, rtol=1e-4, atol=1e-4)
    assert jnp.all(long[128:] == 0)


def test_kernels(mods):
    model = mods["gated/ssm"]
    ks, (fwd, bwd) = eqx.filter_jit(lambda m: (m.kernels(21), m.layer(1).kernels(21)))(model)
    assert ks.shape == (2, 2, 1, 21)
    np.testing.assert_allclose(ks[1, 0], fwd, atol=1e-6)
    np.testing.assert_allclose(ks[1, 1], bwd, atol=1e-6)
    np.testing.assert_allclose(fwd[0], ref_kernel(model.layer(1).forward_routing, 21)[0], atol=1e-5)
    with pytest.raises(ValueError, match="routing='ssm'"):
        mods["stack/attention"].kernels(4)


def test_checkpoint_round_trip(mods, tmp_path):
    """Save a model, rebuild a fresh one from its config (real initialisation), load."""
    model = mods["gated/ssm"]
    path = tmp_path / "bigs.eqx"
    eqx.tree_serialise_leaves(path, model)
    fresh = eqx.filter_jit(lambda k: ls.BiGS(**model.config(), key=k))(
        jr.key(99, impl="unsafe_rbg")
    )
    loaded = eqx.tree_deserialise_leaves(path, fresh)
    tokens = jnp.arange(9) % VOCAB
    np.testing.assert_array_equal(encode(loaded, tokens), encode(model, tokens))
    assert jnp.all(jnp.isfinite(encode(fresh, tokens)))


# ------------------------------------------------------------------------- heads


def test_heads_shapes_and_real_token_pooling(mods, getkey):
    x = jr.normal(getkey(), (10, DIM))
    mask = jnp.arange(10) < 6
    garbage = x.at[6:].set(100.0)
    emb = jr.normal(getkey(), (VOCAB, DIM))
    cls, span, mc, mlm = (mods[n] for n in ("cls", "span", "mc", "mlm"))
    # An untied head whose own decoder is `emb` computes what the tied head does with it.
    untied = eqx.tree_at(lambda h: h.decoder, mlm, emb, is_leaf=lambda v: v is None)

    @eqx.filter_jit
    def run(cls, span, mc, mlm, untied):
        out = cls(x, mask, inference=True)
        return dict(
            cls=out,
            cls_garbage=cls(garbage, mask, inference=True),
            cls_short=cls(x[:6], inference=True),
            span=span(x, mask),
            mc=mc(jnp.stack([x, garbage, -x]), jnp.stack([mask] * 3), inference=True),
            mc_single=mc.scorer(x, mask, inference=True),
            mlm=mlm(x, emb),
            mlm_untied=untied(x),
        )

    r = run(cls, span, mc, mlm, untied)
    assert r["cls"].shape == (3,)
    np.testing.assert_allclose(r["cls_garbage"], r["cls"], atol=1e-6)
    np.testing.assert_allclose(r["cls_short"], r["cls"], atol=1e-6)
    pooled = np.tanh(ref_dense(cls.pooler, f64(x[:6]).mean(0)))
    np.testing.assert_allclose(r["cls"], ref_dense(cls.classifier, pooled), atol=1e-5)

    start, end = r["span"]
    assert start.shape == end.shape == (10,)
    assert jnp.all(start[6:] == jnp.finfo(jnp.float32).min) and jnp.all(start[:6] > -1e3)
    want = ref_dense(span.proj, f64(x[:6]))
    np.testing.assert_allclose(jnp.stack([start, end], -1)[:6], want, atol=1e-5)

    assert r["mc"].shape == (3,)
    np.testing.assert_allclose(r["mc"][0], r["mc"][1], atol=1e-6)
    np.testing.assert_allclose(r["mc"][0], r["mc_single"][0], atol=1e-6)

    assert r["mlm"].shape == (10, VOCAB)
    h = ref_ln(mlm.norm, ref_exact_gelu(ref_dense(mlm.transform, f64(x))))
    np.testing.assert_allclose(r["mlm"], h @ f64(emb).T + f64(mlm.bias), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(r["mlm_untied"], r["mlm"])
    assert ls.MaskedLMHead(DIM, VOCAB, tied=False, key=getkey()).decoder.shape == (VOCAB, DIM)


def test_encoder_composes_embeddings_norms_and_layers(getkey):
    """The encoder is `LN_emb(E[tok] + P[:L] + T[types])`, zeroed at pads, its layers one
    by one, then `LN_final`, zeroed at pads (random weights, norms included)."""
    abstract = eqx.filter_eval_shape(
        ls.BiGS, VOCAB, DIM, 2, max_length=20, num_token_types=2, num_heads=2, key=jr.key(0)
    )
    model = _random_params(abstract, 11)
    tokens = jr.randint(getkey(), (12,), 0, VOCAB)
    types = jr.randint(getkey(), (12,), 0, 2)
    mask = jnp.arange(12) < 9

    @eqx.filter_jit
    def both(model, tokens, types, mask):
        got = model(tokens, mask, types, inference=True)
        h = model.token_embedding.weight[tokens] + model.position_embedding.weight[:12]
        h = h + model.token_type_embedding.weight[types]
        h = jnp.where(mask[:, None], jax.vmap(model.embedding_norm)(h), 0)
        for i in range(model.num_layers):
            h = model.layer(i)(h, mask, inference=True)
        return got, jnp.where(mask[:, None], jax.vmap(model.final_norm)(h), 0)

    got, want = both(model, tokens, types, mask)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dropout_masks_are_placed_and_drawn_independently(getkey):
    """Embedding dropout acts after the embedding LayerNorm; a STACK layer's branches and a
    multiple-choice head's choices each draw their own mask."""
    p = 0.5
    # An encoder whose one layer adds nothing (W_o = 0): the output is dropout(LN(h)).
    model = ls.BiGS(VOCAB, DIM, 1, max_length=20, dropout=p, final_norm=False, key=getkey())
    model = eqx.tree_at(
        lambda m: (m.layers.out_proj.weight, m.layers.out_proj.bias),
        model,
        (jnp.zeros_like(model.layers.out_proj.weight), jnp.zeros_like(model.layers.out_proj.bias)),
    )
    tokens = jr.randint(getkey(), (20,), 0, VOCAB)
    out = eqx.filter_jit(lambda m, t, k: m(t, key=k))(model, tokens, getkey())
    h = model.token_embedding.weight[tokens] + model.position_embedding.weight
    normed = jax.vmap(model.embedding_norm)(h)
    dropped = out == 0
    assert 0.4 < float(dropped.mean()) < 0.6
    np.testing.assert_allclose(out[~dropped], normed[~dropped] / (1 - p), rtol=1e-5, atol=1e-6)
    # STACK: the attention branch adds exactly 1 and the MLP exactly 2 before dropout; with
    # independent masks the sum takes each of 0, 2, 4, 6 (x 1 / (1 - p)) about 1/4 of the time.
    layer = ls.StackLayer(8, routing="attention", num_heads=2, dropout=p, key=getkey())
    attention_out = layer.routing_blocks[0].attention.output_proj
    constant = lambda lin, c: (jnp.zeros_like(lin.weight), jnp.full_like(lin.bias, c))
    layer = eqx.tree_at(
        lambda m: (
            m.routing_blocks[0].attention.output_proj.weight,
            m.routing_blocks[0].attention.output_proj.bias,
            m.mlp_out.weight,
            m.mlp_out.bias,
        ),
        layer,
        (*constant(attention_out, 1.0), *constant(layer.mlp_out, 2.0)),
    )
    added = eqx.filter_jit(lambda m, x, k: m(x, key=k))(layer, jnp.zeros((64, 8)), getkey())
    values, counts = np.unique(np.round(np.asarray(added), 4), return_counts=True)
    np.testing.assert_array_equal(values, [0.0, 2.0, 4.0, 6.0])
    assert counts.min() > 0.15 * added.size
    # Multiple choice: four identical choices get four different dropout masks.
    mc = ls.MultipleChoiceHead(DIM, dropout=p, key=getkey())
    x = jnp.broadcast_to(jr.normal(getkey(), (6, DIM)), (4, 6, DIM))
    scores = eqx.filter_jit(lambda h, x, k: h(x, key=k, inference=False))(mc, x, getkey())
    assert len(set(np.asarray(scores).tolist())) == 4


def test_inference_mode_disables_dropout(mods, getkey):
    """`eqx.nn.inference_mode` switches dropout off everywhere (no key needed), as for
    `eqx.nn.Dropout`; an explicit `inference=` still wins."""
    tokens = jnp.arange(9) % VOCAB
    x = jr.normal(getkey(), (9, DIM))
    model, cls = mods["gated/ssm"], mods["cls"]
    layer, mc = model.layer(0), mods["mc"]
    frozen = eqx.nn.inference_mode((model, layer, cls, mc))
    key = getkey()

    @eqx.filter_jit
    def run(model, layer, cls, mc, frozen):
        fm, fl, fc, fmc = frozen
        return dict(
            model=(fm(tokens), fm(tokens, key=key), model(tokens, inference=True)),
            layer=(fl(x), layer(x, inference=True)),
            cls=(fc(x), cls(x, inference=True)),
            mc=(fmc(x[None]), mc(x[None], inference=True)),
            on=(fm(tokens, key=key, inference=False), model(tokens, key=key)),
        )

    r = run(model, layer, cls, mc, frozen)
    for name in ("model", "layer", "cls", "mc"):
        for got in r[name][:-1]:
            np.testing.assert_array_equal(got, r[name][-1], err_msg=name)
    np.testing.assert_array_equal(r["on"][0], r["on"][1])
    assert not np.allclose(r["on"][1], r["model"][-1])
    # Dropout without a key: the same error from the encoder, its layers and the heads.
    for call in (lambda: model(tokens), lambda: layer(x), lambda: cls(x), lambda: mc(x[None])):
        with pytest.raises(ValueError, match="key is required for dropout.*inference=True"):
            call()
    # A rate held as an array (Dropout.p is a leaf) is not read as a bool when a key is given.
    traced = eqx.tree_at(lambda h: h.dropout.p, cls, jnp.asarray(0.1))
    out = eqx.filter_jit(lambda h, x, k: h(x, key=k, inference=False))(traced, x, key)
    assert out.shape == (3,) and bool(jnp.all(jnp.isfinite(out)))


def test_edits_with_tree_at_are_followed(getkey):
    """`num_layers` and a head's `num_outputs` are read off the arrays, so cutting the
    stacked layers or swapping the classifier keeps the model working (they were static
    copies: a keyed call failed in `scan`, `layer(2)` returned layer 1 as JAX clamps,
    and the head's output failed its own type check). Dropout flags set apart, which one
    decision for the model would overrule, are an error."""
    tokens = jnp.arange(6) % VOCAB
    model = ls.BiGS(VOCAB, DIM, 3, dropout=0.1, state_size=4, key=getkey())
    cut = lambda x: x[:2] if eqx.is_array(x) and x.ndim else x
    two = eqx.tree_at(lambda m: m.layers, model, jax.tree.map(cut, model.layers))
    assert two.num_layers == two.config()["num_layers"] == 2
    assert two(tokens, key=getkey()).shape == (6, DIM)
    with pytest.raises(ValueError, match=r"i must be an integer in \[-2, 2\), got i=2"):
        two.layer(2)
    head = ls.SequenceClassificationHead(DIM, 3, key=getkey())
    five = eqx.tree_at(lambda h: h.classifier, head, eqx.nn.Linear(DIM, 5, key=getkey()))
    assert five.num_outputs == 5 and five(jnp.ones((4, DIM))).shape == (5,)
    # The models of an eqx.filter_vmap ensemble give their own sizes, not the ensemble's
    # (4 layers and 4 outputs, as the ensemble's axis leads every array).
    keys = jr.split(getkey(), 4)
    models = eqx.filter_vmap(lambda k: ls.BiGS(VOCAB, DIM, 2, state_size=4, key=k))(keys)
    assert models.num_layers == models.config()["num_layers"] == 2
    with pytest.raises(ValueError, match=r"layer\(i\) of an ensemble .* under eqx.filter_vmap"):
        models.layer(0)
    first = eqx.filter_vmap(lambda m: m.layer(-1))(models)
    assert first.v_proj.weight.shape == (4, *models.layers.v_proj.weight.shape[2:])
    heads = eqx.filter_vmap(lambda k: ls.SequenceClassificationHead(DIM, 3, key=k))(keys)
    assert heads.num_outputs == 3
    mixed = eqx.tree_at(lambda m: m.dropout, model, eqx.nn.inference_mode(model.dropout))
    with pytest.raises(ValueError, match="dropout modules' `inference` flags differ"):
        mixed(tokens, key=getkey())
    np.testing.assert_array_equal(mixed(tokens, inference=True), model(tokens, inference=True))


def test_dropout_is_off_by_default():
    """Built without `dropout=`, the encoder and heads need no key (as Equinox's layers);
    the named configurations carry the paper's 0.1."""
    tokens, mask = jnp.arange(6), jnp.arange(6) < 4
    model = ls.BiGS(10, 8, 1, key=jr.key(0))
    heads = (
        ls.SequenceClassificationHead(8, 3, key=jr.key(1)),
        ls.MultipleChoiceHead(8, key=jr.key(2)),
    )
    assert model.dropout_rate == 0.0 and heads[0].dropout.p == heads[1].scorer.dropout.p == 0.0

    @eqx.filter_jit
    def run(model, heads, tokens, mask):
        # Without a key and in inference mode, in one compilation.
        h = model(tokens, mask)
        return [
            (h, model(tokens, mask, inference=True)),
            (heads[0](h, mask), heads[0](h, mask, inference=True)),
            (heads[1](h[None], mask[None]), heads[1](h[None], mask[None], inference=True)),
        ]

    for without_key, inference in run(model, heads, tokens, mask):
        np.testing.assert_array_equal(without_key, inference)
    for name in ls.bigs.BIGS_CONFIGS:
        assert ls.bigs.BIGS_CONFIGS[name]["dropout"] == 0.1, name


# ------------------------------------------------------------------ parameters


def _count(make):
    return ls.count_parameters(eqx.filter_eval_shape(make))


@pytest.mark.parametrize(
    "architecture, routing, per_d2",
    [
        ("gated", "ssm", 13),
        ("stack", "ssm", 12),
        ("stack", "attention", 12),
        ("gated", "attention", 19),
    ],
)
def test_per_layer_parameter_count(architecture, routing, per_d2):
    """Paper, section 3: ~13 d^2 per GATED/SSM layer vs ~12 d^2 per STACK layer."""
    d = 256
    make = lambda: ls.BiGS(10, d, 1, architecture=architecture, routing=routing, key=jr.key(0))
    count = ls.count_parameters(eqx.filter_eval_shape(make).layers)
    assert abs(count / d**2 - per_d2) < 0.1


def test_layer_defaults_and_initialisation():
    """GATED defaults to SSM routing and inner 3d (BiGS), STACK to attention and 4d (BERT);
    dense weights have BERT's initialisation (truncated normal, std 0.02, so |w| <= 0.04;
    zero biases), distinct matrices even when drawn together."""
    g = eqx.filter_eval_shape(lambda: ls.GatedLayer(8, key=jr.key(0)))
    s = eqx.filter_eval_shape(lambda: ls.StackLayer(8, key=jr.key(0)))
    assert (g.routing, g.inner_dim, s.routing, s.inner_dim) == ("ssm", 24, "attention", 32)
    assert isinstance(g.forward_routing, ls.DirectionalSSM)
    assert isinstance(s.routing_blocks[0].attention, ls.MultiHeadAttention)
    layer = eqx.filter_jit(lambda k: ls.StackLayer(64, key=k))(jr.key(1, impl="unsafe_rbg"))
    mha = layer.routing_blocks[0].attention
    projections = (mha.query_proj, mha.key_proj, mha.value_proj, mha.output_proj)
    for lin in (*projections, layer.mlp_in, layer.mlp_out):
        w = np.asarray(lin.weight)
        assert np.abs(w).max() <= 0.04 + 1e-6 and 0.015 < w.std() < 0.02
        assert np.all(np.asarray(lin.bias) == 0)
    assert not np.allclose(mha.query_proj.weight, mha.key_proj.weight)
    # GATED/ATT's attention too (the ablation compares like with like).
    gated = eqx.filter_jit(lambda k: ls.GatedLayer(64, routing="attention", key=k))(jr.key(2))
    for mha in (gated.forward_routing, gated.backward_routing):
        for lin in (mha.query_proj, mha.key_proj, mha.value_proj):
            w = np.asarray(lin.weight)
            assert np.abs(w).max() <= 0.04 + 1e-6 and 0.015 < w.std() < 0.02
            assert np.all(np.asarray(lin.bias) == 0)
        assert mha.output_proj is None
    # The SSMs' steps start log-uniform in the reference implementation's [0.01, 1], in
    # the layers and the encoder alike (one step per shared kernel).
    steps = [
        jnp.exp(ssm.kernel_fn.log_dt)
        for k in range(16)
        for ssm in (
            ls.GatedLayer(8, key=jr.key(k)).forward_routing,
            ls.BiGS(11, 8, 1, key=jr.key(k)).layer(0).backward_routing,
        )
    ]
    steps = np.concatenate(steps)
    assert steps.shape == (32,) and 0.01 <= steps.min() and steps.max() <= 1.0
    assert steps.min() < 0.03 and steps.max() > 0.3  # spread over the range, not S4's
    # Their LegS modes keep B = 1, as in the reference implementation (S4DKernel's
    # S4D-LegS B would weight the fastest mode 68 times the slowest at N = 64).
    kernel = ls.GatedLayer(8, key=jr.key(0)).forward_routing.kernel_fn
    assert kernel.init == "legs"
    np.testing.assert_array_equal(kernel.b_real, 1)
    np.testing.assert_array_equal(kernel.b_imag, 0)


def test_default_num_heads_divide_dim():
    """Without `num_heads`, attention gets `dim // 64` heads, or the largest count below
    that divides `dim` (at d = 200 the default 3 heads were an error naming `num_heads`,
    which the user never passed)."""
    for dim, heads in ((64, 1), (200, 2), (1024, 16)):
        stack = eqx.filter_eval_shape(lambda d=dim: ls.StackLayer(d, key=jr.key(0)))
        assert stack.routing_blocks[0].attention.num_heads == heads, dim
    gated = eqx.filter_eval_shape(lambda: ls.GatedLayer(200, routing="attention", key=jr.key(0)))
    assert gated.forward_routing.num_heads == gated.backward_routing.num_heads == 2
    model = eqx.filter_eval_shape(lambda: ls.BiGS(10, 200, 1, routing="attention", key=jr.key(0)))
    assert model.config()["num_heads"] is None


def test_count_parameters_leaf_kinds():
    tree = {
        "numpy": np.ones(3),
        "jax": jnp.ones((2, 2)),
        "abstract": jax.ShapeDtypeStruct((5,), jnp.float32),
        "ints": jnp.ones(4, jnp.int32),
        "static": 7.0,
    }
    assert ls.count_parameters(tree) == 3 + 4 + 5


def test_named_config_sizes():
    sizes = {
        name: _count(lambda n=name: ls.BiGS.from_config(n, key=jr.key(0)))
        for name in ("bigs-large", "bigs-12", "bert-large")
    }
    assert 3.3e8 < sizes["bigs-large"] < 3.6e8  # paper: ~350M
    assert 1.1e8 < sizes["bigs-12"] < 1.25e8  # paper: 119M
    assert 3.2e8 < sizes["bert-large"] < 3.45e8  # BERT-Large: ~335M
    model = eqx.filter_eval_shape(lambda: ls.BiGS.from_config("bigs-large", key=jr.key(0)))
    assert model.layers.v_proj.weight.shape == (23, 3072, 1024)
    assert model.config()["num_layers"] == 23


# ------------------------------------------------------------------ bad inputs


def test_checks_without_jaxtyping(mods, no_jaxtyping):
    # The annotations reject these first when jaxtyping checks; the library's own checks
    # must hold when it does not (JAXTYPING_DISABLE=1).
    layer = mods["gated/ssm"].layer(0)
    with pytest.raises(ValueError, match=r"mask must have shape \(5,\) like x"):
        layer(jnp.ones((5, DIM)), jnp.ones(4, bool), inference=True)
    with pytest.raises(ValueError, match=r"mask must have shape \(5,\)"):
        layer.forward_routing(jnp.ones((5, DIM)), jnp.ones(4, bool))
    with pytest.raises(TypeError, match="reverse must be a bool, got reverse='no'"):
        ls.DirectionalSSM(8, reverse="no", key=jr.key(0))
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got dropout=None"):
        ls.GatedLayer(8, dropout=None, key=jr.key(0))
    with pytest.raises(ValueError, match=r"mask must have shape \(3,\) like x"):
        ls.masked_mean(jnp.ones((3, 2)), jnp.ones(1, bool))
    with pytest.raises(
        ValueError, match=r"x must have shape \(length >= 1, dim=8\), got x.shape=\(0, 8\)"
    ):
        ls.SequenceClassificationHead(8, 3, key=jr.key(0))(jnp.ones((0, 8)), inference=True)
    # Options of the other routing are checked too (a config must rebuild either way).
    for option, pattern in [
        (dict(ssm_init="xx"), "ssm_init must be one of"),
        (dict(state_size=3), "state_size=3"),
        (dict(dt_min=5.0, dt_max=1.0), "dt_min=5.0"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            ls.BiGS(10, 8, 1, routing="attention", key=jr.key(0), **option)
    # NumPy integers are sizes (stored as ints: a NumPy one would be traced when built;
    # `num_heads`, `state_size` and a NumPy `dropout` were, and the build failed).
    model = ls.BiGS(
        np.int64(10), np.int64(8), np.int64(1), inner_dim=np.int32(24), num_heads=np.int64(2),
        state_size=np.int64(16), dropout=np.float64(0.0), key=jr.key(0),
    )  # fmt: skip
    assert (model.dim, model.num_layers) == (8, 1) and type(model.dim) is int
    config = model.config()
    assert [type(config[k]) for k in ("num_heads", "state_size", "dropout")] == [int, int, float]
    assert json.loads(json.dumps(config)) == config
    head = ls.SequenceClassificationHead(np.int64(8), np.int64(3), key=jr.key(0))
    assert head(jnp.ones((5, 8)), inference=True).shape == (3,)
    with pytest.raises(ValueError, match="num_token_types must be an integer >= 0"):
        ls.BiGS(10, 8, 1, num_token_types=-1, key=jr.key(0))


def test_narrow_token_dtypes_and_masked_mean_mask(mods):
    """uint8 tokens are checked in a wide type (263 does not wrap to 7 in uint8, so a
    263-token model takes every byte); `masked_mean` wants a boolean mask (a float or
    int mask would count its values, not its real positions)."""
    # One model (one compilation of its initialiser) for the tokens and the token types.
    model = ls.BiGS(263, DIM, 1, dropout=0.0, num_token_types=2, key=jr.key(0))
    tokens = jnp.array([97, 98, 250, 255], jnp.uint8)
    both = eqx.filter_jit(lambda m, *tokens: [m(t, inference=True) for t in tokens])
    np.testing.assert_allclose(*both(model, tokens, tokens.astype(jnp.int32)))
    types = jnp.array([0, 1, 2, 0], jnp.uint8)
    typed = lambda: model(tokens, token_types=types, inference=True)
    assert_check_fails(r"token_types: ids must be in \[0, num_token_types=2\)", typed)
    x = jnp.arange(12.0).reshape(6, 2)
    for mask in (jnp.full(6, 0.5), jnp.array([2, 2, 0, 0, 0, 0])):
        with pytest.raises(TypeError, match="mask must be boolean"):
            ls.masked_mean.__wrapped__(x, mask)  # as called without jaxtyping's hook


def test_masked_mean_takes_numpy_and_names_non_arrays():
    """NumPy arrays are arrays, as the hints say (with the import hook and without);
    `None` or a list is a `TypeError` naming the argument (it was an AttributeError)."""
    x, mask = np.arange(6.0, dtype=np.float32).reshape(3, 2), np.array([True, True, False])
    for mean in (ls.masked_mean, ls.masked_mean.__wrapped__):
        np.testing.assert_allclose(mean(x, mask), [1.0, 2.0])
        for args, name in [((None,), "x"), ((x.tolist(),), "x"), ((x, mask.tolist()), "mask")]:
            with pytest.raises(TypeError, match=name):
                mean(*args)
    with pytest.raises(TypeError, match=r"mask must be a JAX or NumPy array or None, got mask="):
        ls.masked_mean.__wrapped__(x, [True, True, False])


def test_token_errors_name_the_id_and_pads_may_hold_any_id(mods, no_jaxtyping):
    """Outside `jit` the first bad id and its position are named; ids at padded
    positions are not checked (pipelines pad with -100 or vocab_size) and do not change
    the outputs."""
    model = mods["gated/ssm"]
    eager = lambda tokens, mask=None: model(tokens, mask, inference=True)  # `encode` jits
    tokens, mask = jnp.arange(9) % VOCAB, jnp.arange(9) < 5
    with pytest.raises(ValueError, match=rf"vocab_size={VOCAB}\), got id {VOCAB} at tokens\[3\]"):
        eager(tokens.at[3].set(VOCAB))
    want = encode(model, tokens, mask)
    for pad in (-100, VOCAB, 10**6):
        padded = tokens.at[5:].set(pad)
        np.testing.assert_allclose(eager(padded, mask), want, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(encode(model, padded, mask), want)
    assert_check_fails("ids must be in", encode, model, tokens.at[2].set(-100), mask)  # jitted
    # NumPy int64 ids are checked before JAX's 32-bit conversion (2**32 + 1 would wrap to 1).
    wide = np.asarray(tokens, np.int64)
    with pytest.raises(ValueError, match=r"got id 4294967297 at tokens\[1\]"):
        eager(wide + np.eye(9, dtype=np.int64)[1] * 2**32)
    with pytest.raises(ValueError, match=r"got id 4294967297 at token_types\[0\]"):
        typed = ls.BiGS(VOCAB, DIM, 1, num_token_types=2, dropout=0.0, key=jr.key(0))
        typed(wide, token_types=np.array([2**32 + 1] + [0] * 8, np.int64), inference=True)
    # The shared check itself: masks of another shape or dtype, unsigned and 0-d ids.
    from lineax_seq._checks import check_ids

    ids, where = jnp.array([1, 2, 9]), jnp.array([0, 0, 2])  # an int mask: 2 is True
    with pytest.raises(ValueError, match=r"the mask of t must have its shape \(3,\)"):
        check_ids("t", ids, 5, "V", where[:2])
    with pytest.raises(ValueError, match=r"got id 9 at t\[2\]"):
        check_ids("t", ids, 5, "V", where)
    traced = eqx.filter_jit(lambda i, w: check_ids("t", i, 5, "V", w))
    assert_check_fails(r"t: ids must be in \[0, V=5\)", traced, ids, where)
    with pytest.raises(ValueError, match=r"got id 18446744073709551615 at t\[1\]"):
        check_ids("t", np.array([1, 2**64 - 1], np.uint64), 5, "V")
    with pytest.raises(ValueError, match=r"got id 9$"):
        check_ids("t", jnp.asarray(9), 5, "V")
    # The shared finite check reads 0-d arrays too (np.argwhere of one is empty).
    from lineax_seq._checks import check_finite

    with pytest.raises(ValueError, match=r"x contains NaN or inf values \(1 of 1"):
        check_finite("x", jnp.asarray(jnp.nan))
    with pytest.raises(TypeError, match="final_norm must be a bool, got final_norm='no'"):
        ls.BiGS(VOCAB, DIM, 1, final_norm="no", key=jr.key(0))


def test_vocab_size_follows_embedding_surgery(mods, no_jaxtyping):
    """`vocab_size` is the embedding's row count: after `eqx.tree_at` grows the
    vocabulary the new ids are accepted, and after it shrinks the dropped ids are
    refused (a static copy refused the first and let a clamped gather take the second)."""
    model = mods["gated/ssm"]
    rows = lambda n: eqx.tree_at(
        lambda m: m.token_embedding.weight,
        model,
        jnp.resize(model.token_embedding.weight, (n, DIM)),
    )
    grown, shrunk = rows(VOCAB + 4), rows(VOCAB - 10)
    assert (grown.vocab_size, shrunk.vocab_size) == (VOCAB + 4, VOCAB - 10)
    assert grown.config()["vocab_size"] == VOCAB + 4
    tokens = jnp.arange(6).at[2].set(VOCAB + 2)
    assert grown(tokens, inference=True).shape == (6, DIM)
    with pytest.raises(ValueError, match=rf"vocab_size={VOCAB - 10}\), got id {VOCAB - 5}"):
        shrunk(tokens.at[2].set(VOCAB - 5), inference=True)


def test_bad_inputs(mods):
    model = mods["gated/ssm"]
    tokens = jnp.arange(9)
    with pytest.raises(Exception, match="mask"):
        encode(model, tokens, jnp.ones(7, bool))
    too_large = tokens.at[3].set(VOCAB)
    assert_check_fails(r"ids must be in \[0, vocab_size=50\)", encode, model, too_large)
    assert_check_fails("vocab_size=50", encode, model, tokens.at[0].set(-1))
    with pytest.raises(ValueError, match="length 0"):
        encode(model, jnp.zeros((0,), jnp.int32))
    with pytest.raises(ValueError, match="key is required"):
        model(tokens)
    with pytest.raises(ValueError, match="num_token_types=0"):
        model(tokens, token_types=jnp.zeros(9, jnp.int32), inference=True)
    # Under pytest's jaxtyping hook a wrong Literal is a TypeCheckError, else ValueError.
    with pytest.raises(Exception, match="routing"):
        ls.BiGS(10, 8, 1, routing="conv", key=jr.key(0))
    with pytest.raises(Exception, match="architecture"):
        ls.BiGS(10, 8, 1, architecture="parallel", key=jr.key(0))
    with pytest.raises(Exception, match="kernel"):
        ls.GatedLayer(8, kernel="diagonal", key=jr.key(0))
    with pytest.raises(ValueError, match="name must be one of"):
        ls.BiGS.from_config("bigs-huge", key=jr.key(0))
    bert = eqx.filter_eval_shape(
        lambda: ls.BiGS(10, 8, 1, routing="attention", max_length=4, key=jr.key(0))
    )
    with pytest.raises(ValueError, match="max_length=4"):
        eqx.filter_eval_shape(lambda m: m(jnp.arange(5), inference=True), bert)
    # Layers, SSMs and heads check what the encoder checks.
    layer = model.layer(0)
    with pytest.raises(ValueError, match=r"x must have shape \(length >= 1, dim=16\)"):
        layer(jnp.ones((5, 6)), inference=True)
    with pytest.raises(ValueError, match=r"u must have shape \(length >= 1, dim=16\)"):
        layer.forward_routing(jnp.ones((5, 6)))
    for make in (
        lambda: ls.GatedLayer(8, dropout=1.5, key=jr.key(0)),
        lambda: ls.SequenceClassificationHead(8, 2, dropout=-0.1, key=jr.key(0)),
    ):
        with pytest.raises(ValueError, match="dropout must be in \\[0, 1\\)"):
            make()
    head = ls.MaskedLMHead(DIM, VOCAB, key=jr.key(0))
    with pytest.raises(ValueError, match=r"embedding must have shape .*\(50, 16\).*\(49, 16\)"):
        head(jnp.ones((3, DIM)), jnp.ones((VOCAB - 1, DIM)))
    with pytest.raises(ValueError, match="embedding is required.*tied=False"):
        head(jnp.ones((3, DIM)))
    untied = ls.MaskedLMHead(DIM, VOCAB, tied=False, key=jr.key(0))
    with pytest.raises(ValueError, match=r"embedding must be None for an untied head"):
        untied(jnp.ones((3, DIM)), jnp.ones((VOCAB, DIM)))
    with pytest.raises(Exception, match="tied"):  # TypeCheckError under the hook
        ls.MaskedLMHead(DIM, VOCAB, tied="no", key=jr.key(0))
    with pytest.raises(ValueError, match=r"i must be an integer in \[-2, 2\), got i=2"):
        model.layer(2)
    with pytest.raises(ValueError, match="num_heads=-3"):
        ls.GatedLayer(8, num_heads=-3, key=jr.key(0))
    with pytest.raises(ValueError, match=r"shape \(length >= 1, dim=16\), got x.shape=\(7, 9\)"):
        mods["span"](jnp.ones((7, 9)))
    with pytest.raises(ValueError, match=r"got x.shape=\(3, 7, 15\)"):
        mods["mc"](jnp.ones((3, 7, 15)), inference=True)


def test_shapes_checked_without_jaxtyping(mods, no_jaxtyping):
    """Inputs of the wrong rank, and masks or token types of another shape, are a
    `ValueError` naming them (a length-1 one broadcast silently, others failed deep
    inside, by an IndexError or LayerNorm's message); float ids are a `TypeError`."""
    model, tokens, x = mods["gated/ssm"], jnp.arange(4), jnp.ones((4, DIM))
    like_tokens = r"must have shape \(4,\) like tokens, got "
    for call, pattern in [
        (lambda: model(jnp.zeros((2, 4), jnp.int32)), r"tokens must have shape \(length,\)"),
        (lambda: model(jnp.asarray(3)), r"tokens must have shape \(length,\), got .*\(\)"),
        (lambda: model(tokens, jnp.ones((4, 1), bool)), "mask " + like_tokens),
        (lambda: model(tokens, token_types=jnp.zeros(1, jnp.int32)), "token_types " + like_tokens),
        (lambda: model.layer(0)(jnp.ones((2, 4, DIM))), r"x must have shape \(length >= 1, dim=16"),
        (lambda: mods["span"](x, jnp.ones(1, bool)), r"mask must have shape \(4,\) like x"),
        (lambda: mods["span"](jnp.ones(DIM)), r"x must have shape \(length >= 1, dim=16\)"),
        (lambda: mods["mc"](x[None], jnp.ones((2, 4), bool)), r"mask must have shape \(1, 4\)"),
        (lambda: mods["mc"](x), r"x must have shape \(choices >= 1, length >= 1, dim=16\)"),
        (
            lambda: mods["mlm"](jnp.ones(DIM), jnp.ones((VOCAB, DIM))),
            r"x must have shape \(n >= 1, dim",
        ),
    ]:
        with pytest.raises(ValueError, match=pattern):
            call()
    with pytest.raises(TypeError, match="tokens must be integer ids, got tokens.dtype=float32"):
        model(jnp.arange(4.0), inference=True)


def test_dtypes_checked_without_jaxtyping(mods, no_jaxtyping):
    """A float mask is a `TypeError` (an additive one, zeros for "keep", was read as all
    padding and zeroed every output), and so is an integer input to a layer or SSM (its
    result came back rounded to integers)."""
    model, tokens, x = mods["gated/ssm"], jnp.arange(4), jnp.ones((4, DIM))
    additive = jnp.zeros(4)
    for call in (
        lambda: model(tokens, additive, inference=True),
        lambda: model.layer(0)(x, additive, inference=True),
        lambda: model.layer(0).forward_routing(x, additive),
        lambda: mods["span"](x, additive),
        lambda: ls.masked_mean(x, additive),
    ):
        with pytest.raises(TypeError, match="mask must be boolean .*got mask.dtype=float32"):
            call()
    ints = jnp.ones((4, DIM), jnp.int32)
    for name, call in (
        ("x", lambda: model.layer(0)(ints, inference=True)),
        ("u", lambda: model.layer(0).forward_routing(ints)),
    ):
        with pytest.raises(TypeError, match=f"{name} must have a real floating dtype"):
            call()


def test_masks_must_be_trailing_padding(mods):
    """A concrete mask with a hole or leading padding is an error naming the position,
    for the encoder, its layers and the SSMs: padding-exactness is defined for trailing
    padding only. A trailing mask and an all-True one pass. (Under `jit` masks are not
    checked: see `test_bigs_train_step_with_padding_on_mesh`.)"""
    model, tokens = mods["gated/ssm"], jnp.arange(6)
    layer, x = model.layer(0), jnp.ones((6, DIM))
    hole = np.array([True, True, False, True, False, False])
    leading = jnp.array([False, True, True, True, True, True])
    message = r"mask must be trailing padding \(True at real tokens, then False to the end\)"
    for call in (
        lambda m: model(tokens, m, inference=True),
        lambda m: layer(x, m, inference=True),
        lambda m: layer.forward_routing(x, m),
        lambda m: mods["bwd"](jnp.ones((6, 5)), m),
    ):
        with pytest.raises(ValueError, match=message + ", got mask\\[2\\]=False before mask"):
            call(hole)
        with pytest.raises(ValueError, match=message + ", got mask\\[0\\]=False before mask"):
            call(leading)
        for m in (jnp.arange(6) < 4, jnp.ones(6, bool), jnp.zeros(6, bool)):
            assert bool(jnp.all(jnp.isfinite(call(m))))
    for variant in VARIANTS:  # every routing
        with pytest.raises(ValueError, match=message):
            mods[variant](tokens, hole, inference=True)


def test_directional_ssm_zero_at_padding_and_low_precision(getkey):
    """Padded outputs are zero, as documented (the causal direction used to carry its
    state into the padding), and bfloat16 inputs work for both kernel kinds."""
    u = jr.normal(getkey(), (6, 8))
    mask = jnp.arange(6) < 3
    for kernel in ("shared", "per_channel"):
        ssm = ls.DirectionalSSM(8, kernel=kernel, state_size=8, key=getkey())
        y = ssm(u, mask)
        assert np.all(np.asarray(y[3:]) == 0)
        np.testing.assert_allclose(y[:3], ssm(u[:3]), rtol=1e-5, atol=1e-6)
        low = ssm(u.astype(jnp.bfloat16))
        assert low.dtype == jnp.bfloat16
        np.testing.assert_allclose(low.astype(jnp.float32), ssm(u), atol=0.05, rtol=0.05)


def test_directional_ssm_bfloat16_is_one_rounding(getkey):
    """bfloat16 inputs are convolved in float32 with the float32 kernel: the output is
    the float32 result on the same inputs, rounded once (not a bfloat16 kernel's)."""
    u = jr.normal(getkey(), (512, 4)).astype(jnp.bfloat16)
    for kernel in ("shared", "per_channel"):
        ssm = ls.DirectionalSSM(4, kernel=kernel, state_size=8, reverse=True, key=getkey())
        want = ssm(u.astype(jnp.float32)).astype(jnp.bfloat16).astype(jnp.float32)
        got = ssm(u).astype(jnp.float32)
        ulp = 2.0**-7 * np.abs(np.asarray(want))  # one bfloat16 rounding step
        assert np.all(np.abs(np.asarray(got - want)) <= ulp + 1e-6), kernel


def test_low_precision_parameters(mods, getkey):
    """A module cast to bfloat16 or float16 (every float leaf) runs under strict dtype
    promotion, per-channel kernels included (their float32 kernel met a bfloat16 `D`)."""
    ssm = mods["bwd_per_channel"]
    u = jr.normal(getkey(), (7, 5))
    want = ssm(u)
    for dtype in (jnp.bfloat16, jnp.float16):
        cast = lambda a, dtype=dtype: a.astype(dtype) if a.dtype == jnp.float32 else a
        low = jax.tree.map(cast, ssm)
        y = low(u.astype(dtype))
        assert y.dtype == dtype
        np.testing.assert_allclose(y.astype(jnp.float32), want, rtol=0.05, atol=0.05)


def test_init_std(getkey):
    """`init_std` sets the std of every dense weight and embedding (truncated normal at
    2 std: 0.88 std); at d = 64, BERT's 0.02 leaves a fresh GATED layer's update ~1e-7
    (SSM) or ~1e-10 (attention) of its input, 0.02 sqrt(1024 / 64) gives it the paper's
    d = 1024 scale."""
    is_weighted = lambda m: isinstance(m, (eqx.nn.Linear, eqx.nn.Embedding))

    def weights(module):
        leaves = jax.tree.leaves(module, is_leaf=is_weighted)
        return [np.asarray(m.weight) for m in leaves if is_weighted(m)]

    # Every architecture x routing, with every embedding (NumPy scalars are accepted).
    variants = (
        ("gated", "ssm", 7),  # W_v, W_f, W_b, W_u1, W_u2, W_u, W_o
        ("gated", "attention", 13),  # ... and two attentions' q, k, v
        ("stack", "ssm", 6),  # two SSM blocks' in/out, W_1, W_2
        ("stack", "attention", 6),  # q, k, v, o, W_1, W_2
    )
    keys = [getkey() for _ in range(len(variants) + 4)]

    @eqx.filter_jit
    def build(keys):
        # Every model and head in one compilation (op by op, each initialiser compiles).
        make = lambda architecture, routing, key: ls.BiGS(
            50, 64, 2, architecture=architecture, routing=routing, num_token_types=2,
            max_length=16, init_std=np.float64(0.08), key=key,
        )  # fmt: skip
        models = [make(a, r, key) for (a, r, _), key in zip(variants, keys, strict=False)]
        heads = (
            ls.MaskedLMHead(64, 50, init_std=0.08, key=keys[-4]),
            ls.SequenceClassificationHead(64, 64, init_std=0.08, key=keys[-3]),
            ls.SpanExtractionHead(64, init_std=0.08, key=keys[-2]),
            ls.MultipleChoiceHead(64, init_std=0.08, key=keys[-1]),
        )
        return models, heads

    models, heads = build(keys)
    for (architecture, routing, count), model in zip(variants, models, strict=True):
        assert model.config()["init_std"] == pytest.approx(0.08)
        found = weights(model)
        assert len(found) == 3 + count, (architecture, routing)  # + 3 embeddings
        for w in found:
            np.testing.assert_allclose(np.std(w), 0.88 * 0.08, rtol=0.1)
    for head in heads:
        for w in weights(head):
            assert 0.05 < np.std(w) < 0.09 and w.size >= 64

    @eqx.filter_jit
    def updates(key):
        # |layer(x) - x| / |x| of fresh GATED layers, every case in one compilation: both
        # routings at d = 64 with BERT's 0.02 and with 0.02 sqrt(1024 / 64) = 0.08, and at
        # the paper's d = 1024 with 0.02. In float64: float32 rounds an update below ~1e-7
        # of |x| away.
        out = {}
        for routing in ("ssm", "attention"):
            for dim, init_std in ((64, 0.02), (64, 0.08), (1024, 0.02)):
                x = jr.normal(jr.fold_in(key, dim), (32, dim), jnp.float64)
                layer = ls.GatedLayer(dim, routing=routing, init_std=init_std, key=key)
                y = layer(x, inference=True)
                assert y.dtype == jnp.float64
                out[routing, dim, init_std] = jnp.linalg.norm(y - x) / jnp.linalg.norm(x)
        return out

    # On the CPU: on an H200 (jax 0.11.2) XLA fused the d = 1024 float64 products into a
    # Triton GEMM that asked for more shared memory than the GPU has (RESOURCE_EXHAUSTED).
    with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
        rel = {case: float(v) for case, v in updates(getkey()).items()}
    # The figures of `BiGS`'s docstring: ~1e-7 (SSM) and ~1e-10 (attention) at d = 64,
    # against ~5e-3 and ~1e-4 at d = 1024, which 0.08 restores at d = 64.
    assert 3e-8 < rel["ssm", 64, 0.02] < 3e-7 and 3e-11 < rel["attention", 64, 0.02] < 3e-10
    for routing, scale in (("ssm", 5e-3), ("attention", 1e-4)):
        paper, small = rel[routing, 1024, 0.02], rel[routing, 64, 0.08]
        assert scale / 3 < paper < 3 * scale and 0.5 < small / paper < 2, (routing, rel)
    for bad in (0.0, -0.02, float("nan"), float("inf")):
        for make in (
            functools.partial(ls.BiGS, 50, 8, 1),
            functools.partial(ls.StackLayer, 8),
            functools.partial(ls.MaskedLMHead, 8, 50),
        ):
            with pytest.raises(ValueError, match="init_std must be a positive, finite real number"):
                make(init_std=bad, key=jr.key(0))


def test_bert_tiny_uses_word_order():
    """The named BERT configurations have absolute positions: permuting the tokens
    changes more than the order of the outputs."""
    bert = ls.BiGS.from_config("bert-tiny", vocab_size=VOCAB, key=jr.key(0))
    tokens = jnp.arange(12) % VOCAB
    perm = jnp.arange(12)[::-1]
    out = bert(tokens, inference=True)
    assert not np.allclose(out[perm], bert(tokens[perm], inference=True), atol=1e-3)


def test_numpy_and_jax_step_sizes_are_floats(no_jaxtyping):
    """`dt_min` / `dt_max` given as NumPy or JAX scalars are used as floats (a JAX array
    became a static field, and in `BiGS` a tracer inside its compiled build); a NumPy
    `state_size` is stored as an int (Equinox warned of an array set as static)."""
    model = ls.BiGS(10, 8, 1, dt_min=np.float32(1e-3), dt_max=jnp.asarray(0.1), key=jr.key(0))
    assert type(model.dt_min) is float and type(model.dt_max) is float
    assert json.loads(json.dumps(model.config()))["dt_max"] == pytest.approx(0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Equinox warns of a JAX array set as static
        ls.GatedLayer(8, dt_min=jnp.asarray(1e-3), state_size=np.int64(16), key=jr.key(0))


def test_encoder_after_device_put_and_under_plain_jit():
    """`jax.device_put(model, ...)` and `jax.jit` over the model turn the stacked layers'
    dropout rate into 0-d arrays, which the layer scan took for stacked ones (IndexError),
    and a rate of 0 became 'key is required for dropout'. Whether dropout runs is decided
    on the rates of all the dropout modules."""
    model = ls.BiGS(50, 8, 2, state_size=4, key=jr.key(0))
    tokens = jnp.arange(12)
    want = model(tokens, inference=True)
    placed = jax.device_put(model, jax.devices()[0])
    np.testing.assert_array_equal(placed(tokens, inference=True), want)
    jitted = jax.jit(lambda m, t: m(t, inference=True))(model, tokens)
    np.testing.assert_allclose(jitted, want, rtol=1e-6, atol=1e-6)
    layer = jax.device_put(model.layer(0), jax.devices()[0])  # a 0-d array rate of 0
    np.testing.assert_array_equal(layer(want), model.layer(0)(want))
    # Without dropout a training call needs no key, under jax.jit too (a traced rate of 0
    # asked for one "(dropout > 0)"), for a lone layer as for the model (a layer kept no
    # static rate, so even its default call failed under jax.jit).
    training = jax.jit(lambda m, t: m(t, inference=False))(model, tokens)
    np.testing.assert_allclose(training, want, rtol=1e-6, atol=1e-6)
    for architecture in (ls.GatedLayer, ls.StackLayer):
        layer = architecture(8, state_size=4, key=jr.key(1))
        for inference in (None, False):
            got = jax.jit(lambda g, x: g(x, inference=inference))(layer, want)  # noqa: B023
            np.testing.assert_allclose(got, layer(want), rtol=1e-6, atol=1e-6)
    # The static rate stands in only for a traced one: a rate set after building is used.
    noisy = eqx.tree_at(lambda m: m.dropout.p, model, 0.5)
    assert not np.allclose(noisy(tokens, key=jr.key(2), inference=False), want)
    assert noisy.config()["dropout"] == 0.5
    # Under jax.jit such a rate is traced and the static copy (0) stands in for it: where
    # dropout is on, a run-time error says so (it was skipped silently); where it is
    # off, nothing is wrong.
    for inference in (None, False):
        run = jax.jit(lambda m, t, k: m(t, key=k, inference=inference))  # noqa: B023
        message = "not the model's dropout_rate=0 .*changed with"
        assert_check_fails(message, run, noisy, tokens, jr.key(2))
    # A rate set on the layers alone counts as well (the embedding's rate of 0 decided
    # for every layer, and their dropout was skipped silently). Eagerly on layers that
    # move their input (at this width the default init moves it by ~1e-10).
    layers_only = eqx.tree_at(lambda m: m.layers.dropout.p, model, 0.5)
    assert layers_only.config()["dropout"] == 0.5
    assert_check_fails(message, run, layers_only, tokens, jr.key(2))
    moving = ls.BiGS(50, 8, 2, state_size=4, init_std=0.5, key=jr.key(0))
    moving_layers_only = eqx.tree_at(lambda m: m.layers.dropout.p, moving, 0.5)
    dropped = moving_layers_only(tokens, key=jr.key(2), inference=False)
    assert np.abs(dropped - moving(tokens, inference=True)).max() > 1e-2
    for off in (jax.jit(lambda m, t: m(t, inference=True))(noisy, tokens),
                jax.jit(lambda m, t: m(t))(eqx.nn.inference_mode(noisy), tokens)):  # fmt: skip
        np.testing.assert_allclose(off, want, rtol=1e-6, atol=1e-6)
    dropping = ls.BiGS(50, 8, 2, state_size=4, dropout=0.1, key=jr.key(0))
    with pytest.raises(ValueError, match=r"key is required for dropout \(rate 0.1\)"):
        jax.jit(lambda m, t: m(t, inference=False))(dropping, tokens)


def test_placed_model_runs_as_the_original():
    """After `jax.device_put` (the dropout rates and flags become 0-d arrays) a BiGS runs
    as before without `inference=`: eagerly (the scan traced the flag: a boolean
    conversion error), with dropout keys (a training call), `layer(i)` (it indexed the
    0-d arrays) and `kernels` (it vmapped them); a traced flag is a clear error."""
    model = ls.BiGS(50, 8, 2, state_size=4, dropout=0.1, key=jr.key(0))
    placed = jax.device_put(model, jax.devices()[0])
    assert isinstance(placed.dropout.inference, jax.Array)  # what the fix has to handle
    tokens, key = jnp.arange(12), jr.key(1)
    np.testing.assert_array_equal(placed(tokens, key=key), model(tokens, key=key))
    off = eqx.nn.inference_mode(model)
    np.testing.assert_array_equal(jax.device_put(off)(tokens), off(tokens))
    np.testing.assert_array_equal(placed.kernels(6), model.kernels(6))
    x = off(tokens)
    np.testing.assert_array_equal(
        placed.layer(1)(x, inference=True), model.layer(1)(x, inference=True)
    )
    with pytest.raises(TypeError, match="`inference` flag is traced .* inference=True or False"):
        eqx.filter_jit(lambda m: m(tokens, key=key))(placed)


@pytest.mark.parametrize("rate", [np.float64(0.1), jnp.asarray(0.0)])
def test_head_dropout_rate_is_a_static_float(rate):
    """A NumPy or JAX rate was kept as an array leaf: trained (weight decay shrank it) and,
    at 0, traced under jit, where it asked for a key."""
    head = ls.SequenceClassificationHead(8, 3, dropout=rate, key=jr.key(0))
    assert type(head.dropout.p) is float and head.dropout.p == float(rate)
    assert all(a.ndim > 0 for a in jax.tree.leaves(eqx.filter(head, eqx.is_array)))
    x = jr.normal(jr.key(1), (5, 8))
    call = eqx.filter_jit(lambda h, x, key: h(x, key=key))
    out = call(head, x, None if float(rate) == 0 else jr.key(2))
    assert out.shape == (3,)
    choice = ls.MultipleChoiceHead(8, dropout=rate, key=jr.key(0))
    assert type(choice.scorer.dropout.p) is float


def test_heads_under_plain_jit_and_after_device_put():
    """The heads keep a static copy of their dropout rate, as `BiGS` does: under
    `jax.jit` (every leaf traced) or after `jax.device_put` a rate of 0 needs no key and
    no `inference=` (both asked for one)."""
    x, mask = jr.normal(jr.key(1), (5, 8)), jnp.arange(5) < 3
    cls = ls.SequenceClassificationHead(8, 3, key=jr.key(0))
    mc = ls.MultipleChoiceHead(8, key=jr.key(0))
    want = cls(x, mask), mc(x[None], mask[None])
    for inference in (None, False):

        @jax.jit
        def run(heads, inference=inference):
            return heads[0](x, mask, inference=inference), heads[1](
                x[None], mask[None], inference=inference
            )

        for out, ref in zip(run((cls, mc)), want, strict=True):
            np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    placed = jax.device_put((cls, mc), jax.devices()[0])
    got = eqx.filter_jit(lambda h: (h[0](x, mask), h[1](x[None], mask[None])))(placed)
    for out, ref in zip(got, want, strict=True):
        np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    # A rate of 0.1 still needs a key (it is not told apart from 0 by the traced leaf).
    dropping = ls.SequenceClassificationHead(8, 3, dropout=0.1, key=jr.key(0))
    with pytest.raises(ValueError, match=r"key is required for dropout \(rate 0.1\)"):
        jax.jit(lambda h: h(x, inference=False))(dropping)


def test_masked_mean_sums_half_precision_in_float32():
    """A float16 sum over the real tokens overflowed (4096 x 20 > 65504: inf, and NaN
    logits from the heads); `jnp.mean`, the path without a mask, did not."""
    x = jnp.full((4096, 4), 20, jnp.float16)
    mean = ls.masked_mean(x, jnp.ones(4096, bool))
    assert mean.dtype == jnp.float16
    np.testing.assert_array_equal(mean, ls.masked_mean(x))
    np.testing.assert_array_equal(mean, jnp.full(4, 20, jnp.float16))
    head = ls.SequenceClassificationHead(4, 2, key=jr.key(0))
    head = jax.tree.map(lambda a: a.astype(jnp.float16) if eqx.is_inexact_array(a) else a, head)
    assert bool(jnp.isfinite(head(x, jnp.arange(4096) < 4000)).all())


def test_head_inputs_need_every_axis(no_jaxtyping):
    """Zero choices (or positions) is an error, not an empty score vector, and a tied MLM
    head with hidden states of the wrong width names `x` (jaxtyping blamed the
    embedding, checked after `x` had bound `dim`)."""
    mc = ls.MultipleChoiceHead(8, key=jr.key(0))
    with pytest.raises(ValueError, match=r"x must have shape \(choices >= 1, length >= 1, dim=8"):
        mc(jnp.ones((0, 5, 8)))
    with pytest.raises(ValueError, match=r"x must have shape \(length >= 1, dim=8\)"):
        ls.SpanExtractionHead(8, key=jr.key(0))(jnp.ones((0, 8)))


def test_tied_mlm_head_names_x():
    head = ls.MaskedLMHead(16, 50, key=jr.key(0))
    with pytest.raises(ValueError, match=r"x must have shape \(n >= 1, dim=16\), got .*\(8, 32\)"):
        head(jnp.ones((8, 32)), jnp.ones((50, 16)))
