"""Block-State Transformer: causality, block loop oracle, decoding == forward, lengths, errors.

Tiny shapes (dim 8, 2 heads, window 4, length 16); every layer kind is built once per
module, and the causality / decoding tests run one model that stacks all eight kinds, so
each jitted function compiles once.
"""

import inspect
import json
import math
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.test_util
import numpy as np
import pytest
from _compiles import compilations, traces
from _devices import assert_check_fails, needs_cuda
from jax.flatten_util import ravel_pytree

import lineax_seq as ls

DIM, HEADS, W, L, VOCAB = 8, 2, 4, 16, 7
VARIANTS = [
    "slide",
    "brect",
    "sh:s4",
    "mh:s4",
    "mf:s4",
    "sh:unstruct",
    "mh:unstruct",
    "mf:unstruct",
]


def make_layer(variant: str, key):
    if variant == "slide":
        return ls.SlidingWindowLayer(DIM, HEADS, W, mlp_dim=16, key=key)
    if variant == "brect":
        return ls.BlockRecurrentTransformerLayer(DIM, HEADS, W, num_states=3, mlp_dim=16, key=key)
    context, ssm = variant.split(":")
    return ls.BlockStateTransformerLayer(
        DIM,
        HEADS,
        W,
        context=context,
        ssm=ssm,
        state_size=4,
        ssm_features=2,
        num_filters=3,
        mlp_dim=16,
        max_length=L,
        key=key,
    )


@pytest.fixture(scope="module")
def zoo():
    return {v: make_layer(v, jr.key(i)) for i, v in enumerate(VARIANTS)}


@pytest.fixture(scope="module")
def stack(zoo):
    """An LM whose eight layers are one of each kind (so one compile covers them all)."""
    lm = ls.BlockStateTransformerLM(
        VOCAB, DIM, len(VARIANTS), num_heads=HEADS, window=W, bst_layers=(), key=jr.key(99)
    )
    return eqx.tree_at(lambda m: m.layers, lm, tuple(zoo[v] for v in VARIANTS))


@pytest.fixture(scope="module")
def sh_lm():
    return ls.BlockStateTransformerLM.from_variant(
        "BST:SH:S4", VOCAB, DIM, 2, num_heads=HEADS, window=W, bst_layers=(0,), key=jr.key(7)
    )


@eqx.filter_jit
def _forward_pair(model, xs):
    return jax.vmap(model)(xs)


@eqx.filter_jit
def _hidden_pair(lm, tokens):
    """Logits and every layer's output, for a batch of token sequences."""

    def run(tok):
        x = lm.embedding.weight[tok]
        hidden = []
        for layer in lm.layers:
            x = layer(x)
            hidden.append(x)
        return lm(tok), hidden

    return jax.vmap(run)(tokens)


@eqx.filter_jit
def _decode(lm, tokens):
    cache = lm.init_cache(tokens.shape[0])
    return jax.lax.scan(lambda c, tok: lm.step(c, tok), cache, tokens)[1]


# ----------------------------------------------------------------------------- oracle


def _softmax_attention(q, k, v, allowed, bias):
    logits = jnp.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1]) + bias
    logits = jnp.where(allowed[None], logits, -jnp.inf)
    return jnp.einsum("hqk,khd->qhd", jax.nn.softmax(logits, axis=-1), v)


def _dense(layer, a):
    return a @ layer.weight.T + (0.0 if layer.bias is None else layer.bias)


def _block_loop_reference(layer, x):
    """Each block on its own, keys gathered explicitly, plain softmax attention.

    BRECT: the states are carried through the Python loop one block at a time (read by
    the block's tokens, then updated from the block's keys/values with the fixed gate).
    """
    bst = isinstance(layer, ls.BlockStateTransformerLayer)
    brect = isinstance(layer, ls.BlockRecurrentTransformerLayer)
    attn = layer.self_attention if bst or brect else layer.attention
    mha = attn.attention
    states = layer.initial_state if brect else None
    split = lambda a: a.reshape(a.shape[0], HEADS, DIM // HEADS)
    h = jax.vmap(layer.attention_norm)(x)
    q = mha.queries(h)
    k, v = mha.keys_values(h)
    if bst:
        y = layer.ssm(h)
        qc = jax.vmap(layer.cross_query)(h).reshape(L, HEADS, DIM // HEADS)
    outputs = []
    for b in range(L // W):
        block = slice(b * W, (b + 1) * W)
        lo = max(0, (b - 1) * W)
        qpos = np.arange(b * W, (b + 1) * W)[:, None]
        kpos = np.arange(lo, (b + 1) * W)[None, :]
        allowed = jnp.asarray((qpos - kpos >= 0) & (qpos - kpos < W))
        buckets = ls.relative_position_bucket(jnp.asarray(kpos - qpos), bidirectional=False)
        bias = jnp.moveaxis(attn.relative_bias.embedding[buckets], -1, 0)
        heads = _softmax_attention(
            q[block], k[lo : (b + 1) * W], v[lo : (b + 1) * W], allowed, bias
        )
        if brect:
            s = jax.vmap(layer.state_norm)(states) + layer.state_ids
            sk, sv = (
                split(_dense(layer.state_attention.key_proj, s)),
                split(_dense(layer.state_attention.value_proj, s)),
            )
            everything = lambda a, b: jnp.ones((a, b), bool)
            qc = split(_dense(layer.cross_query, h[block]))
            cross = _softmax_attention(qc, sk, sv, everything(W, len(s)), 0.0)
            mixed = jnp.concatenate([heads.reshape(W, DIM), cross.reshape(W, DIM)], -1)
            out = x[block] + _dense(layer.output, mixed)
            sq = split(_dense(layer.state_attention.query_proj, s))
            s_self = _softmax_attention(sq, sk, sv, everything(len(s), len(s)), 0.0)
            sq2 = split(_dense(layer.state_cross_query, s))
            s_cross = _softmax_attention(sq2, k[block], v[block], everything(len(s), W), 0.0)
            mixed = jnp.concatenate([s_self.reshape(len(s), DIM), s_cross.reshape(len(s), DIM)], -1)
            g = 1 / (1 + jnp.exp(-layer.gate_bias))
            states = g * states + (1 - g) * _dense(layer.state_output, mixed)
        elif not bst:
            out = x[block] + jax.vmap(mha.output_proj)(heads.reshape(W, DIM))
        else:
            if layer.context_kind == "mf":
                # The S filter outputs at the end of block b - 1, lifted, plus the IDs.
                mf = layer.context
                ctx = mf.initial if b == 0 else y[b * W - 1]
                z = _dense(mf.lift, ctx) + mf.context_ids
                ck, cv = split(_dense(mf.key_proj, z)), split(_dense(mf.value_proj, z))
                c_allowed = jnp.ones((W, ck.shape[0]), bool)
            else:
                ck, cv = layer.context._kv(y[block])
                c_allowed = jnp.tril(jnp.ones((W, W), bool))
            cross = _softmax_attention(qc[block], ck, cv, c_allowed, 0.0)
            mixed = jnp.concatenate([heads.reshape(W, DIM), cross.reshape(W, DIM)], -1)
            out = x[block] + jax.vmap(layer.output)(mixed)
        z = jax.vmap(layer.mlp_norm)(out)
        out = out + jax.vmap(lambda a: layer.mlp.down(jax.nn.relu(layer.mlp.up(a))))(z)
        outputs.append(out)
    return jnp.concatenate(outputs)


ORACLE_VARIANTS = ["slide", "brect", "sh:s4", "mh:unstruct", "mf:s4"]


def test_block_parallel_equals_block_loop(zoo, getkey):
    layers = [zoo[v] for v in ORACLE_VARIANTS]
    x = jr.normal(getkey(), (L, DIM))
    both = eqx.filter_jit(lambda ms, x: [(m(x), _block_loop_reference(m, x)) for m in ms])
    for variant, (got, want) in zip(ORACLE_VARIANTS, both(layers, x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=variant)


def test_gradients_of_every_layer_kind_match_finite_differences():
    """Reverse-mode gradients of each layer kind (FFT and chunked convolutions, the MF
    block ends behind optimisation barriers, BRECT's scan over blocks, relative-bias
    attention), in its input and its parameters, against central differences in float64."""
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        layers = [make_layer(v, jr.key(i)) for i, v in enumerate(VARIANTS)]
        params, static = eqx.partition(layers, eqx.is_inexact_array)
        flat, unravel = ravel_pytree(params)
        assert flat.dtype == jnp.float64

        @jax.jit
        def outputs(flat, x):
            return [m(x) for m in eqx.combine(unravel(flat), static)]

        x = jr.normal(jr.key(0), (L, DIM), jnp.float64)
        jax.test_util.check_grads(outputs, (flat, x), order=1, modes="rev", eps=1e-6)


# ----------------------------------------------------------------------------- LM level


def test_causality_of_every_layer_and_decoding_matches_forward(stack, getkey):
    """One forward compile of the 8-kind stack: LM and per-layer causality, then decoding."""
    tokens = jr.randint(getkey(), (L,), 0, VOCAB)
    t = 6  # mid-block, so within-block causality matters too
    perturbed = tokens.at[t + 1 :].set((tokens[t + 1 :] + 1) % VOCAB)
    (full, full2), hidden = _hidden_pair(stack, jnp.stack([tokens, perturbed]))
    assert full.shape == (L, VOCAB) and np.isfinite(full).all()
    for variant, h in zip(VARIANTS, hidden, strict=True):
        np.testing.assert_allclose(
            h[0, : t + 1], h[1, : t + 1], rtol=0, atol=1e-5, err_msg=f"{variant} is not causal"
        )
        assert not np.allclose(h[0, t + 1 :], h[1, t + 1 :], atol=1e-3), variant
    np.testing.assert_allclose(full[: t + 1], full2[: t + 1], rtol=0, atol=1e-5)
    np.testing.assert_allclose(_decode(stack, tokens), full, rtol=1e-4, atol=1e-4)


def test_prefill_then_decoding_matches_forward(stack, getkey):
    """`prefill` feeds whole blocks in one parallel pass: its logits are the forward's,
    and stepping on from its cache continues them, for every layer kind, also from a
    cache taken after fewer blocks than given (generate's padded prefix), which ignores
    the later tokens."""
    tokens = jr.randint(getkey(), (L,), 0, VOCAB)
    junk = tokens.at[W:].set((tokens[W:] + 1) % VOCAB)

    @eqx.filter_jit
    def run(lm, tokens, junk):
        _, full = lm.prefill(tokens, L)
        after_one, _ = lm._prefill(junk, jnp.asarray(1, jnp.int32), L)
        later = jax.lax.scan(lambda c, t: lm.step(c, t), after_one, tokens[W:])[1]
        return full, lm(tokens), later

    full, forward, later = run(stack, tokens, junk)
    np.testing.assert_allclose(full, forward, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(later, full[W:], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="multiple of"):
        stack.prefill(tokens[: W + 1], L)
    with pytest.raises(
        ValueError, match=r"`max_length`=4 must be at least the number of tokens, 8"
    ):
        stack.prefill(tokens[: 2 * W], W)


@pytest.mark.parametrize("length", [5, 2 * W])  # whole blocks and a remainder, or none
def test_generate_greedy_matches_forward(sh_lm, getkey, length):
    prompt = jr.randint(getkey(), (length,), 0, VOCAB)
    # top_k=1 makes sampling greedy, whatever the temperature.
    out = ls.generate(sh_lm, prompt, L - length, key=getkey(), temperature=1.0, top_k=1)
    assert out.shape == (L,)
    np.testing.assert_array_equal(out[:length], prompt)
    logits = _forward_pair(sh_lm, jnp.stack([out, out]))[0]
    np.testing.assert_array_equal(out[length:], jnp.argmax(logits[length - 1 : -1], axis=-1))


def test_generate_compiles_once_per_power_of_two_and_extends_samples(sh_lm, getkey):
    """Prompts of 5-7 tokens (one whole block) and 3-11 steps (totals 9-16) share one
    compilation; a sample with more steps extends the one with fewer (each position has
    its own key)."""
    key, tokens = getkey(), jr.randint(getkey(), (9,), 0, VOCAB)
    first = ls.generate(sh_lm, tokens[:5], 5, key=key)  # total 10: compiles for 16
    with compilations() as compiled:
        longer = [ls.generate(sh_lm, tokens[:5], steps, key=key) for steps in (8, 11)]
        other = [ls.generate(sh_lm, tokens[:n], 16 - n, key=key) for n in (6, 7)]
    assert "jit(_generate)" not in compiled
    for out in longer:
        np.testing.assert_array_equal(out[:10], first)
    # Position p is drawn with jax.random.fold_in(key, p - 1) from the logits at p - 1.
    logits = _forward_pair(sh_lm, jnp.stack([longer[1], longer[1]]))[0]  # 16 tokens
    for p in range(5, 16):
        draw = jr.categorical(jr.fold_in(key, p - 1), logits[p - 1])  # temperature 1
        assert int(longer[1][p]) == int(draw), p
    for n, out in zip((6, 7), other, strict=True):
        assert out.shape == (16,)
        np.testing.assert_array_equal(out[:n], tokens[:n])


def test_generate_batches_under_vmap_and_runs_under_jit(sh_lm, getkey):
    """Batched sampling is `jax.vmap` over prompts and keys, equal to one call each
    (the prompt is traced there); `jax.jit` of a call works too."""
    prompts = jr.randint(getkey(), (3, W + 2), 0, VOCAB)
    keys = jr.split(getkey(), 3)
    sample = lambda prompt, key: ls.generate(sh_lm, prompt, 5, key=key)
    batched = jax.vmap(sample)(prompts, keys)
    for prompt, key, got in zip(prompts, keys, batched, strict=True):
        np.testing.assert_array_equal(got, sample(prompt, key))
    np.testing.assert_array_equal(jax.jit(sample)(prompts[0], keys[0]), batched[0])
    # A temperature sweep under vmap (it was refused: "known when tracing"): each equals
    # its own call, 0 greedy included; a traced bad temperature fails at run time.
    temperatures = jnp.array([0.0, 0.5, 1.0])
    at = lambda t: ls.generate(sh_lm, prompts[0], 5, key=keys[0], temperature=t, top_k=4)
    swept = jax.vmap(at)(temperatures)
    for t, got in zip(temperatures.tolist(), swept, strict=True):
        np.testing.assert_array_equal(got, at(t))
    assert_check_fails("temperature must be a finite, non-negative real number", jax.jit(at), -1.0)
    # Not a batch of them (its hint says so first; without jaxtyping, the function).
    with pytest.raises(TypeError, match="temperature"):
        jax.jit(at)(temperatures)
    raw = inspect.unwrap(ls.generate)
    with pytest.raises(ValueError, match=r"temperature must be a scalar, .* shape \(3,\); sweep"):
        jax.jit(lambda t: raw(sh_lm, prompts[0], 5, key=keys[0], temperature=t))(temperatures)


def test_generate_with_cudnn_attention_where_it_cannot_run(getkey):
    """A model built for cuDNN's attention still generates where that kernel cannot run
    (here: float32 on CPU): the prompt then goes token by token, as XLA's model's."""
    kw = dict(num_heads=HEADS, window=W, bst_layers=(0,), key=jr.key(7))
    fused = ls.BlockStateTransformerLM(VOCAB, DIM, 2, attention_implementation="cudnn", **kw)
    plain = ls.BlockStateTransformerLM(VOCAB, DIM, 2, **kw)
    prompt, key = jr.randint(getkey(), (2 * W + 1,), 0, VOCAB), getkey()
    np.testing.assert_array_equal(
        ls.generate(fused, prompt, 3, key=key), ls.generate(plain, prompt, 3, key=key)
    )


def test_generate_narrow_prompt_dtypes(getkey):
    """Samples are not wrapped to the prompt's dtype and fed back: a uint8 prompt to a
    model of 300 tokens whose head always picks token 299 continues with 299."""
    lm = ls.BlockStateTransformerLM(
        300, DIM, 1, num_heads=HEADS, window=W, bst_layers=(), tie_embeddings=False,
        key=getkey(),
    )  # fmt: skip
    lm = eqx.tree_at(lambda m: m.head.bias, lm, jnp.zeros(300).at[299].set(1e3))
    out = ls.generate(lm, jnp.array([3, 250], jnp.uint8), 4, key=getkey(), temperature=0.0)
    assert out.dtype == jnp.int32
    np.testing.assert_array_equal(out, [3, 250, 299, 299, 299, 299])
    greedy = lambda prompt: ls.generate(lm, prompt, 4, key=getkey(), temperature=0.0)
    assert_check_fails(r"prompt: ids must be in \[0, vocab_size=300\)", greedy, jnp.array([3, 300]))


def test_generate_arguments(sh_lm, getkey):
    """`steps=0` returns the prompt; NumPy integers are accepted; non-integers named."""
    prompt = jr.randint(getkey(), (3,), 0, VOCAB)
    np.testing.assert_array_equal(ls.generate(sh_lm, prompt, 0, key=getkey()), prompt)
    out = ls.generate(sh_lm, prompt, np.int64(2), key=getkey(), top_k=np.int64(1))
    np.testing.assert_array_equal(out, ls.generate(sh_lm, prompt, 2, key=getkey(), top_k=1))
    for kw, name in [(dict(steps=2.0), "steps"), (dict(steps=2, top_k=2.5), "top_k")]:
        with pytest.raises(TypeError, match=name):  # jaxtyping's, or the function's own
            ls.generate(sh_lm, prompt, kw.pop("steps"), key=getkey(), **kw)
    # Checked whatever `steps` is: with 0 they returned the prompt unchecked.
    for kw, message in [
        (dict(temperature=-1.0), "temperature=-1.0"),
        (dict(temperature=float("nan")), "temperature=nan"),
        (dict(top_k=0), "top_k=0"),
        (dict(top_k=VOCAB + 1), rf"top_k={VOCAB + 1}"),
    ]:
        for steps in (0, 1):
            with pytest.raises(ValueError, match=message):
                ls.generate(sh_lm, prompt, steps, key=getkey(), **kw)


def test_generate_names_its_model_and_steps(sh_lm, getkey, no_jaxtyping):
    """A model of another type was an AttributeError (`_check_tokens`), and steps past
    int32's positions an OverflowError from NumPy."""
    prompt = jnp.array([1, 2, 3])
    with pytest.raises(TypeError, match="lm must be an instance of BlockStateTransformerLM, got"):
        ls.generate("lm", prompt, 3, key=getkey())
    with pytest.raises(ValueError, match=r"steps=2147483645 after a prompt of 3"):
        ls.generate(sh_lm, prompt, 2**31 - 3, key=getkey())


@pytest.mark.parametrize("variant", ["BST:SH:S4", "BST:MF:UNSTRUCT"])
def test_decoding_in_bfloat16_and_under_x64(variant, getkey):
    """The decoding caches take the model's dtype: a model cast to bfloat16 decodes in
    bfloat16 (close to its forward pass), and a float32 model decodes under x64."""
    tokens = jr.randint(getkey(), (L,), 0, VOCAB)
    lm = ls.BlockStateTransformerLM.from_variant(
        variant, VOCAB, DIM, 2, num_heads=HEADS, window=W, bst_layers=(0,), max_length=L,
        key=getkey(),
    )  # fmt: skip
    half = _bfloat16(lm)
    # jax.nn.dot_product_attention itself promotes bfloat16 to float32 implicitly.
    with jax.numpy_dtype_promotion("standard"):
        steps = _decode(half, tokens)
        full = _forward_pair(half, tokens[None])[0]
    assert steps.dtype == full.dtype == jnp.bfloat16
    # |logits| < 0.2 here: bfloat16 decoding agrees to ~1e-3; one input token shifted
    # moves them by 0.02-0.06 (a tolerance of 0.1 let that pass).
    np.testing.assert_allclose(steps.astype(jnp.float32), full.astype(jnp.float32), atol=5e-3)
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):  # int32/int64 mixes
        steps = _decode(lm, tokens)
    assert steps.dtype == jnp.float32
    np.testing.assert_allclose(steps, _forward_pair(lm, tokens[None])[0], atol=1e-4)


def test_eager_prefill_compiles_once(stack, getkey):
    """A `prefill` of a model with a BRECT layer compiles once (it compiled its scan over
    blocks anew on every call: ~0.4 s each here)."""
    tokens = jr.randint(getkey(), (L,), 0, VOCAB)
    stack.prefill(tokens, L)
    with compilations() as compiled:
        stack.prefill(tokens, L)
    assert compiled == []


def test_decoding_steps_trace_nothing_and_prefill_is_one_program(stack, sh_lm, getkey):
    """After its first call, `step` traces nothing (it traced `init_cache` on every token
    to check the cache against it: 9x a small model's step; and a weakly typed first
    token compiled the step twice), and a `prefill` is one compiled program (op by op it
    was 10x the jitted forward), whose capacity recompiles nothing where every cache has
    a fixed size. Capacities and lengths no other test uses."""
    tokens = jr.randint(getkey(), (3 * W,), 0, VOCAB)
    first, *later = list(tokens[:4])
    with traces() as traced:  # (what `traces` records: a first step traces)
        cache, _ = stack.step(stack.init_cache(5 * W), jnp.asarray(int(first)))
    assert traced
    with traces() as traced:
        for token in later:
            cache, _ = stack.step(cache, token)
    assert traced == []
    prompt = tokens[: 2 * W]
    with compilations() as compiled:
        stack.prefill(prompt, 7 * W)
    assert compiled == ["jit(_jitted_prefill)"]
    with compilations() as compiled:  # SH:S4 caches have a fixed size
        for capacity in (7 * W, 9 * W):
            sh_lm.prefill(tokens, capacity)
    assert compiled == ["jit(_jitted_prefill)"]


def test_decoding_with_mixed_precision_parameters(stack, getkey):
    """A bfloat16 model whose LayerNorms, embedding and SSM kernels stay float32 (as
    `S4DKernel` advises) computes in float32 where they promote: decoding stores that in
    the bfloat16 caches and matches the forward pass to their rounding; the prefill's
    cache is the one `step` takes. Both crashed inside JAX (a float32 key written into a
    bfloat16 cache; float32 queries against bfloat16 keys)."""
    keep = ("norm", "embedding", "ssm.kernel")
    mixed = jax.tree_util.tree_map_with_path(
        lambda path, a: (
            a
            if not eqx.is_inexact_array(a) or any(w in jax.tree_util.keystr(path) for w in keep)
            else a.astype(jnp.bfloat16)
        ),
        stack,
    )
    assert mixed.layers[0].attention.attention.key_proj.weight.dtype == jnp.bfloat16
    tokens = jr.randint(getkey(), (L,), 0, VOCAB)
    with jax.numpy_dtype_promotion("standard"):
        full = _forward_pair(mixed, tokens[None])[0]
        steps = _decode(mixed, tokens)
        cache, _ = mixed.prefill(tokens[: 2 * W], L)
        after = eqx.filter_jit(lambda c, t: jax.lax.scan(lambda c, x: mixed.step(c, x), c, t)[1])(
            cache, tokens[2 * W :]
        )
        assert ls.generate(mixed, tokens[:5], 3, key=getkey()).shape == (8,)
    assert full.dtype == jnp.float32
    # The logits are small here (|logit| < 0.1): decoding agrees to ~1e-4, and one token
    # of the input shifted moves them by ~0.04.
    for got in (steps, jnp.concatenate([full[: 2 * W], after])):
        np.testing.assert_allclose(got.astype(jnp.float32), full, atol=2e-3)


def test_generate_under_strict_promotion_in_any_dtype(getkey):
    """Under the suite's strict dtype promotion, sampling from a bfloat16 (or float64)
    model, a bfloat16 S4 model's prefill, and decoding under x64 (int32 cache positions
    against int64 aranges) raised TypePromotionError."""
    build = lambda variant: ls.BlockStateTransformerLM.from_variant(
        variant, VOCAB, DIM, 2, num_heads=HEADS, window=W, bst_layers=(1,), max_length=L,
        key=jr.key(0),
    )  # fmt: skip
    prompt = jnp.arange(W + 1) % VOCAB
    half = _bfloat16(build("BST:SH:S4"))
    assert ls.generate(half, prompt, 3, key=getkey()).shape == (W + 4,)  # sampled
    with jax.enable_x64(True):
        wide = build("BST:MF:UNSTRUCT")
        assert wide.embedding.weight.dtype == jnp.float64
        greedy = ls.generate(wide, prompt, 3, key=getkey(), temperature=0.0)
        forward = jnp.argmax(wide(greedy), axis=-1)  # greedy continues the forward pass
        np.testing.assert_array_equal(greedy[W + 1 :], forward[W : W + 3])
        # A traced float32 temperature against the float64 work dtype (a float32 `tiny`
        # raised TypePromotionError).
        key = getkey()
        at = lambda t: ls.generate(wide, prompt, 3, key=key, temperature=t)
        for t in (0.0, 0.5):
            np.testing.assert_array_equal(jax.jit(at)(jnp.float32(t)), at(t))


def test_every_layer_runs_in_bfloat16_under_strict_promotion(zoo, getkey):
    """Every layer cast to bfloat16 maps bfloat16 to bfloat16 under the suite's strict
    dtype promotion, close to its float32 self. MF's block-end outputs (float32, from
    complex states) were added to a bfloat16 skip term and raised TypePromotionError."""
    x = jr.normal(getkey(), (L, DIM))
    half = {v: _bfloat16(layer) for v, layer in zoo.items()}
    got = eqx.filter_jit(lambda ls_, x: {v: f(x) for v, f in ls_.items()})(
        half, x.astype(jnp.bfloat16)
    )
    for variant, y in got.items():
        assert y.dtype == jnp.bfloat16, variant
        np.testing.assert_allclose(y.astype(jnp.float32), zoo[variant](x), rtol=0.1, atol=0.1)


@pytest.mark.parametrize("variant", ["slide", "brect", "sh:s4"])
def test_layers_compute_in_the_dtype_of_params_and_input_together(variant, zoo, getkey):
    """A bfloat16 layer fed float32 `x` computes in float32, as the float32 layer with the
    same (rounded) weights; under x64 a float32 layer fed float64 computes in float64.
    BRECT's recurrent states failed both (its scan's carry kept the parameters' dtype).
    `step` takes such an `x_t` too, rounding what it stores to the cache's bfloat16."""
    x = jr.normal(getkey(), (L, DIM))
    half = _bfloat16(zoo[variant])
    single = jax.tree.map(lambda a: a.astype(jnp.float32) if eqx.is_inexact_array(a) else a, half)
    with jax.numpy_dtype_promotion("standard"):
        got, want = eqx.filter_jit(lambda a, b, x: (a(x), b(x)))(half, single, x)
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)  # bfloat16 param-only ops
        cache, y_0 = half.step(half.init_cache(L), x[0], 0)
        assert jax.tree.map(lambda a: a.dtype, cache) == jax.tree.map(
            lambda a: a.dtype, half.init_cache(L)
        )
        np.testing.assert_allclose(y_0, got[0], rtol=2e-2, atol=2e-2)  # bfloat16 cache
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        y = zoo[variant](np.asarray(x, np.float64))
        assert y.dtype == jnp.float64
        np.testing.assert_allclose(y, want, rtol=1e-2, atol=1e-2)  # bfloat16 weights


def test_pre_layer_norm_in_bfloat16_is_float32_accurate(zoo, getkey):
    """The layers' LayerNorm of a bfloat16 residual stream with an offset (mean 30,
    std 1) is as accurate as `eqx.nn.LayerNorm`'s (float32 inside), not off by about
    `eps * |mean| / std` from subtracting the mean in bfloat16."""
    from lineax_seq.bst._layers import _norm

    norm = _bfloat16(zoo["sh:s4"].attention_norm)
    x = (30 + jr.normal(getkey(), (L, DIM))).astype(jnp.bfloat16)
    got = _norm(norm, x)
    assert got.dtype == jnp.bfloat16
    want = jax.vmap(eqx.nn.LayerNorm(DIM))(x.astype(jnp.float32))  # weight 1, bias 0
    np.testing.assert_allclose(got.astype(jnp.float32), want, atol=2e-2)


def test_tied_head_starts_near_uniform(sh_lm, getkey):
    """Embeddings of std 0.02 (GPT-2) and an unscaled tied head: initial loss ~ log(vocab)."""
    logits = _forward_pair(sh_lm, jr.randint(getkey(), (2, L), 0, VOCAB))
    assert float(logits.std()) < 0.1
    mean_nll = float(-jax.nn.log_softmax(logits).mean())
    assert abs(mean_nll - math.log(VOCAB)) < 0.01
    # The tied head is the embedding matrix itself (no scale, no bias): an untied head
    # holding a copy of it gives the same logits.
    head = eqx.nn.Linear(DIM, VOCAB, key=getkey())
    copy = (sh_lm.embedding.weight, jnp.zeros(VOCAB))
    head = eqx.tree_at(lambda lin: (lin.weight, lin.bias), head, copy)
    untied = eqx.tree_at(lambda m: m.head, sh_lm, head, is_leaf=lambda x: x is None)
    tokens = jr.randint(getkey(), (2, L), 0, VOCAB)
    np.testing.assert_allclose(
        _forward_pair(untied, tokens), _forward_pair(sh_lm, tokens), rtol=1e-6, atol=1e-7
    )


def test_brect_starts_as_meliad():
    """The initial states and the gate biases start N(0, 0.1^2), as meliad's."""
    layer = ls.BlockRecurrentTransformerLayer(64, 4, 32, key=jr.key(0))  # 32 x 64 states
    assert 0.09 < float(jnp.std(layer.initial_state)) < 0.11
    assert 0.06 < float(jnp.std(layer.gate_bias)) < 0.14


@pytest.mark.parametrize("streams", [1, 3])  # the chunked (SH) and the FFT path
def test_context_ssm_skip_starts_at_one(streams, getkey):
    """With the kernels' `C` zeroed, an `"s4"` ContextSSM returns its initial skip `D = 1`
    times the down-projected input, in every stream; `"unstruct"` skips with Hyena's bias."""
    ssm = ls.ContextSSM(DIM, 4, streams, state_size=4, key=getkey())
    assert ssm.skip is not None
    np.testing.assert_array_equal(ssm.skip, np.ones(streams * 4))
    silent = eqx.tree_at(
        lambda m: (m.kernel.c_real, m.kernel.c_imag),
        ssm,
        (jnp.zeros_like(ssm.kernel.c_real), jnp.zeros_like(ssm.kernel.c_imag)),
    )
    x = jr.normal(getkey(), (L, DIM))
    u = x @ ssm.down.weight.T + ssm.down.bias
    want = np.broadcast_to(np.asarray(u)[:, None, :], (L, streams, 4))
    np.testing.assert_allclose(silent(x), want, rtol=1e-5, atol=1e-6)
    hyena = ls.ContextSSM(DIM, 4, streams, ssm="unstruct", max_length=L, key=getkey())
    assert hyena.skip is None and hyena._skip() is hyena.kernel.bias


@pytest.mark.parametrize("variant", ["slide", "brect", "sh:s4", "mh:s4", "mf:s4"])
def test_decoding_cache_does_not_grow_with_the_prefix(zoo, variant):
    """Per-token decoding works on a fixed-size state (attention frame, S4D state, BRECT
    states): `O(window + N)` per token whatever the prefix; "unstruct" stores its inputs."""

    def size(layer, n):
        cache = eqx.filter_eval_shape(layer.init_cache, n)
        return sum(x.size for x in jax.tree.leaves(cache))

    assert size(zoo[variant], L) == size(zoo[variant], 1 << 20)
    assert size(zoo["sh:unstruct"], 2 * L) > size(zoo["sh:unstruct"], L)


def test_s4_model_runs_at_four_times_the_length(sh_lm, getkey):
    long = _forward_pair(sh_lm, jr.randint(getkey(), (2, 4 * L), 0, VOCAB))
    assert long.shape == (2, 4 * L, VOCAB)
    assert np.isfinite(long).all()


def test_variants_and_layer_placement(key):
    assert ls.bst_variant_config("BST:SH:S4")["bst_layers"] == (1, 7, 9)
    # Rescaled, rounded half up: three distinct layers from 4 on (half to even gave (0, 4)
    # of 6).
    scaled = {n: ls.bst_variant_config("BST:MH:S4", n)["bst_layers"] for n in (2, 4, 6, 8, 24)}
    assert scaled == {2: (0, 1), 4: (0, 2, 3), 6: (1, 4, 5), 8: (1, 5, 6), 24: (2, 14, 18)}
    assert all(len(ls.bst_variant_config("BST:MF:S4", n)["bst_layers"]) == 3 for n in range(4, 30))
    assert ls.bst_variant_config("brect:fixed:skip")["recurrent_layers"] == (9,)  # meliad's -3
    assert ls.bst_variant_config("BRECT", 2)["recurrent_layers"] == (0,)
    kinds = {
        "SLIDE": {ls.SlidingWindowLayer},
        "BRECT:FIXED:SKIP": {ls.SlidingWindowLayer, ls.BlockRecurrentTransformerLayer},
        "BST:MF:UNSTRUCT": {ls.SlidingWindowLayer, ls.BlockStateTransformerLayer},
    }
    for variant, expected in kinds.items():
        lm = eqx.filter_eval_shape(
            ls.BlockStateTransformerLM.from_variant,
            variant,
            VOCAB,
            DIM,
            3,
            num_heads=HEADS,
            window=W,
            max_length=L,
            key=key,
        )
        assert {type(layer) for layer in lm.layers} == expected
    # Without `bst_layers` the LM itself places the BST layers as the paper does.
    for n, want in ((12, (1, 7, 9)), (6, (1, 4, 5))):
        lm = eqx.filter_eval_shape(
            ls.BlockStateTransformerLM, VOCAB, DIM, n, num_heads=HEADS, window=W, key=key
        )
        got = tuple(
            i for i, m in enumerate(lm.layers) if isinstance(m, ls.BlockStateTransformerLayer)
        )
        assert got == want


def test_ssm_step_size_range_reaches_the_kernels(key):
    lm = ls.BlockStateTransformerLM(
        VOCAB, DIM, 2, num_heads=HEADS, window=W, bst_layers=(1,), state_size=4,
        dt_min=0.01, dt_max=0.02, key=key,
    )  # fmt: skip
    dt = np.exp(np.asarray(lm.layers[1].ssm.kernel.log_dt))
    assert dt.shape == (DIM // 4,)
    assert (dt >= 0.01 * (1 - 1e-6)).all() and (dt <= 0.02 * (1 + 1e-6)).all()
    with pytest.raises(ValueError, match="dt_min=0.1, dt_max=0.01"):
        ls.BlockStateTransformerLM(
            VOCAB, DIM, 2, num_heads=HEADS, window=W, dt_min=0.1, dt_max=0.01, key=key
        )


def test_attention_implementation(tmp_path, key):
    for build in (
        lambda i: ls.SlidingWindowLayer(DIM, HEADS, W, attention_implementation=i, key=key),
        lambda i: ls.BlockRecurrentTransformerLayer(
            DIM, HEADS, W, attention_implementation=i, key=key
        ),
        lambda i: ls.BlockStateTransformerLayer(DIM, HEADS, W, attention_implementation=i, key=key),
        lambda i: ls.BlockStateTransformerLM(VOCAB, DIM, 2, attention_implementation=i, key=key),
    ):
        with pytest.raises(ValueError, match="attention_implementation must be one of .*'triton'"):
            build("triton")
    # The kernel is a static choice: a model built for cuDNN loads an XLA model's weights.
    kw = dict(num_heads=HEADS, window=W, bst_layers=(0,), recurrent_layers=(1,), key=key)
    xla = ls.BlockStateTransformerLM(VOCAB, DIM, 3, **kw)
    cudnn = ls.BlockStateTransformerLM(VOCAB, DIM, 3, attention_implementation="cudnn", **kw)
    eqx.tree_serialise_leaves(tmp_path / "lm.eqx", xla)
    loaded = eqx.tree_deserialise_leaves(tmp_path / "lm.eqx", cudnn)
    is_window = lambda m: isinstance(m, ls.SlidingWindowAttention)
    windows = [m for m in jax.tree.leaves(loaded, is_leaf=is_window) if is_window(m)]
    assert len(windows) == 3 and all(m.attention.implementation == "cudnn" for m in windows)
    for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(xla), strict=True):
        np.testing.assert_array_equal(a, b)


def _bfloat16(tree):
    """`tree` with its floating-point arrays in bfloat16 (cuDNN's attention dtype)."""
    return jax.tree.map(lambda a: a.astype(jnp.bfloat16) if eqx.is_inexact_array(a) else a, tree)


def _layer_for_cudnn(variant, implementation, key, dim=32, window=8, length=32):
    kw = dict(mlp_dim=2 * dim, attention_implementation=implementation, key=key)
    if variant == "slide":
        return ls.SlidingWindowLayer(dim, HEADS, window, **kw)
    if variant == "brect":
        return ls.BlockRecurrentTransformerLayer(dim, HEADS, window, num_states=8, **kw)
    context, ssm = variant.split(":")
    return ls.BlockStateTransformerLayer(
        dim, HEADS, window, context=context, ssm=ssm, num_filters=4, max_length=length, **kw
    )


@needs_cuda
@pytest.mark.parametrize("variant", ["slide", "brect", "sh:s4", "mh:s4", "mf:unstruct"])
def test_cudnn_layers_match_xla(variant, getkey):
    # Each layer kind in bfloat16 (head size 16), forward and input gradient, cuDNN's
    # kernel against XLA's with the same weights.
    x = _bfloat16(jr.normal(getkey(), (32, 32)))
    k = getkey()
    loss = lambda x, m: jnp.sum(m(x).astype(jnp.float32) ** 2)
    run = eqx.filter_jit(eqx.filter_value_and_grad(loss))
    # (`jax.nn.dot_product_attention` promotes bfloat16 with float32 itself.)
    with jax.numpy_dtype_promotion("standard"):
        want = run(x, _bfloat16(_layer_for_cudnn(variant, None, k)))
        got = run(x, _bfloat16(_layer_for_cudnn(variant, "cudnn", k)))
    f32 = lambda a: np.asarray(a, np.float32)
    np.testing.assert_allclose(f32(got[0]), f32(want[0]), rtol=3e-2)
    scale = np.abs(f32(want[1])).max()
    np.testing.assert_allclose(f32(got[1]), f32(want[1]), atol=5e-2 * scale)


def test_cudnn_lm_traces_under_vmap_and_grad(monkeypatch, key):
    # JAX's cuDNN rule under `jax.vmap` takes only leading vmapped axes (the scan's
    # stacked outputs have theirs second). Tracing, without compiling, needs no GPU once
    # JAX's cuDNN version and device checks are answered for it.
    fa = pytest.importorskip("jax._src.cudnn.fused_attention_stablehlo")
    monkeypatch.setattr(fa, "check_cudnn_version", lambda: 91000)
    monkeypatch.setattr(fa, "check_compute_capability", lambda capability: True)
    monkeypatch.setattr(fa, "is_cuda_compute_capability_equal", lambda capability: False)
    make = lambda key: ls.BlockStateTransformerLM(
        VOCAB, 32, 3, num_heads=HEADS, window=W, bst_layers=(0,), recurrent_layers=(2,),
        attention_implementation="cudnn", key=key,
    )  # fmt: skip
    # Built abstractly (shapes and dtypes are all that tracing needs): nothing is computed.
    lm = eqx.filter_eval_shape(lambda key: _bfloat16(make(key)), key)
    tokens = jnp.zeros((2, L), jnp.int32)
    loss = lambda lm, t: jnp.mean(lm(t).astype(jnp.float32))
    batch_loss = lambda lm, t: jnp.mean(jax.vmap(loss, in_axes=(None, 0))(lm, t))
    with jax.numpy_dtype_promotion("standard"):
        jaxpr = eqx.filter_make_jaxpr(eqx.filter_grad(batch_loss))(lm, tokens)[0]
        per_example = lambda lm, t: jax.vmap(eqx.filter_grad(loss), in_axes=(None, 0))(lm, t)
        eqx.filter_make_jaxpr(per_example)(lm, tokens)
    assert "dot_product_attention_fwd" in str(jaxpr)  # the cuDNN primitive


@needs_cuda
def test_cudnn_lm_batch_is_as_accurate_as_xla(getkey):
    # A vmapped batch and the parameters' gradient (a training step's) of a model with
    # every layer kind: in bfloat16, cuDNN's attention is as close to the float32 model
    # as XLA's is.
    kw = dict(num_heads=HEADS, window=8, bst_layers=(0,), recurrent_layers=(2,), key=getkey())
    tokens = jr.randint(getkey(), (3, 25), 0, VOCAB)

    @eqx.filter_jit
    @eqx.filter_value_and_grad
    def loss(lm, tokens):  # next-token cross-entropy over 24 positions
        logits = jax.vmap(lm)(tokens[:, :-1]).astype(jnp.float32)
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], axis=-1)
        return -jnp.mean(logp)

    flat = lambda value_and_grad: (
        float(value_and_grad[0]),
        np.asarray(ravel_pytree(value_and_grad[1])[0], np.float32),
    )

    lm = ls.BlockStateTransformerLM(VOCAB, 32, 3, **kw)
    cudnn = ls.BlockStateTransformerLM(VOCAB, 32, 3, attention_implementation="cudnn", **kw)
    with jax.numpy_dtype_promotion("standard"):
        exact, xla, fused = (flat(loss(m, tokens)) for m in (lm, _bfloat16(lm), _bfloat16(cudnn)))
    error = lambda run: np.linalg.norm(run[1] - exact[1]) / np.linalg.norm(exact[1])
    assert abs(fused[0] - exact[0]) <= 2 * abs(xla[0] - exact[0]) + 1e-2 * abs(exact[0])
    assert error(fused) <= 1.5 * error(xla) + 1e-2, (error(fused), error(xla))


def test_batched_tokens_are_named_without_jaxtyping(sh_lm, no_jaxtyping):
    """A batch of sequences without `vmap` is named as such (a (2, 8) batch was read as
    2 tokens: "`window`=4 is larger than the sequence length 2")."""
    tokens = jnp.zeros((2, 8), jnp.int32)
    batched = r"`tokens` must have shape \(length,\) \(one sequence: jax.vmap over a batch\)"
    with pytest.raises(ValueError, match=batched + r", got shape \(2, 8\)"):
        sh_lm(tokens)
    with pytest.raises(ValueError, match=batched):
        sh_lm.prefill(tokens, 16)


def test_vocab_size_follows_embedding_surgery(sh_lm, no_jaxtyping):
    """`vocab_size` is the embedding's row count, so ids are checked against the
    vocabulary an `eqx.tree_at` gave the model (a static copy let a shrunk one clamp)."""
    rows = lambda n: eqx.tree_at(
        lambda m: m.embedding.weight, sh_lm, jnp.resize(sh_lm.embedding.weight, (n, DIM))
    )
    grown, shrunk = rows(VOCAB + 3), rows(VOCAB - 3)
    assert (grown.vocab_size, shrunk.vocab_size) == (VOCAB + 3, VOCAB - 3)
    tokens = jnp.arange(W) % VOCAB
    assert grown(tokens.at[1].set(VOCAB + 2)).shape == (W, VOCAB + 3)  # tied head
    with pytest.raises(ValueError, match=rf"vocab_size={VOCAB - 3}\), got id {VOCAB - 1}"):
        shrunk(tokens.at[1].set(VOCAB - 1))


def test_bad_input(sh_lm, key):
    lm = sh_lm
    with pytest.raises(ValueError, match="multiple of `window`=4"):
        lm(jnp.zeros((10,), jnp.int32))
    with pytest.raises(ValueError, match="`window`=4 is larger than the sequence length 2"):
        lm(jnp.zeros((2,), jnp.int32))
    with pytest.raises(Exception, match="tokens"):
        lm(jnp.zeros((2, 8), jnp.int32))
    for layer in lm.layers:  # a BST layer and a sliding-window layer
        with pytest.raises(ValueError, match=r"dim=8\) \(one example.*got shape \(16, 5\)"):
            layer(jnp.zeros((16, 5)))
        with pytest.raises(
            ValueError, match=r"`x_t` must have shape \(dim,\) with dim=8, got shape \(5,\)"
        ):
            layer.step(layer.init_cache(W), jnp.zeros(5), jnp.asarray(0))
    ssm = lm.layers[0].ssm
    expected = r"`x` must have shape \(length, dim\) with dim=8 and length >= 1, got shape "
    with pytest.raises(ValueError, match=expected + r"\(16, 5\)"):
        ssm(jnp.zeros((16, 5)))
    with pytest.raises(ValueError, match=expected + r"\(0, 8\)"):  # as block_ends does
        ssm(jnp.zeros((0, 8)))
    with pytest.raises(ValueError, match="top_k"):
        ls.generate(lm, jnp.zeros((3,), jnp.int32), 2, key=key, top_k=VOCAB + 1)
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match=f"temperature must be a finite.*{bad!r}"):
            ls.generate(lm, jnp.zeros((3,), jnp.int32), 2, key=key, temperature=bad)
    # A vanishing temperature is greedy decoding, not an overflow to NaN / token 0.
    prompt = jnp.array([1, 2, 3])
    greedy = ls.generate(lm, prompt, 4, key=key, temperature=0)
    for tiny in (1e-30, 1e-37, 1e-38, 1e-60):  # sampled (the first two) or greedy
        out = ls.generate(lm, prompt, 4, key=key, temperature=tiny, top_k=2)
        np.testing.assert_array_equal(out, greedy)
    # A huge temperature samples among the top_k candidates, never a masked token (the
    # first sampled token; 4 steps, as above, so that no new decoder is compiled).
    logits = lm(jnp.zeros((W,), jnp.int32).at[:3].set(prompt))[2]
    top = set(np.asarray(jax.lax.top_k(logits, 2)[1]).tolist())
    for huge in (1e30, 1e39, 1e300):
        out = ls.generate(lm, prompt, 4, key=key, temperature=huge, top_k=2)
        assert int(out[len(prompt)]) in top
    # Token ids outside the vocabulary raise instead of being clamped (gathers clamp).
    for bad in (VOCAB, -1):
        message = r"ids must be in \[0, vocab_size=7\)"
        assert_check_fails(f"tokens: {message}", lm, jnp.full((W,), bad, jnp.int32))
        assert_check_fails(f"token: {message}", lm.step, lm.init_cache(W), jnp.int32(bad))
    # Constructor errors: built abstractly, so nothing is computed.
    build = lambda cls, *args, **kw: eqx.filter_eval_shape(cls, *args, key=key, **kw)
    LM = ls.BlockStateTransformerLM
    with pytest.raises(ValueError, match="`num_heads`=3 must divide `dim`=8"):
        build(LM, VOCAB, DIM, 1, num_heads=3, window=W)
    with pytest.raises(ValueError, match="`num_heads`=3 must divide `dim`=8"):
        build(ls.BlockStateTransformerLayer, DIM, 3, W)
    with pytest.raises(ValueError, match="unknown `variant`='BST:XX:S4'"):
        build(LM.from_variant, "BST:XX:S4", VOCAB, DIM)
    with pytest.raises(ValueError, match="context must be one of"):
        build(ls.BlockStateTransformerLayer, DIM, HEADS, W, context="xx")
    with pytest.raises(ValueError, match="ssm must be one of"):
        build(LM, VOCAB, DIM, 1, num_heads=HEADS, window=W, ssm="s5")
    with pytest.raises(ValueError, match="max_length"):
        build(LM, VOCAB, DIM, 1, num_heads=HEADS, window=W, ssm="unstruct")
    with pytest.raises(ValueError, match="bst_layers"):
        build(LM, VOCAB, DIM, 2, num_heads=HEADS, window=W, bst_layers=(2,))
    with pytest.raises(ValueError, match="window"):
        build(ls.SlidingWindowLayer, DIM, HEADS, 0)
    with pytest.raises(ValueError, match="num_heads=0"):
        build(LM, VOCAB, DIM, 1, num_heads=0, window=W)
    with pytest.raises(ValueError, match="num_layers=0"):
        ls.bst_variant_config("BST:SH:S4", 0)
    with pytest.raises(ValueError, match="unknown `variant`=3"):
        ls.bst_variant_config.__wrapped__(3)  # as called without jaxtyping's hook
    # No BST layer, so no UNSTRUCT filter needs a training length: a list says so too.
    build(LM, VOCAB, DIM, 1, num_heads=HEADS, window=W, ssm="unstruct", bst_layers=[])


def test_numpy_integers_accepted(sh_lm, key, no_jaxtyping):
    """NumPy integers work as window sizes and layer indices (as for users who do not
    run jaxtyping's checks on constructors)."""
    assert ls.SlidingWindowLayer(DIM, HEADS, np.int64(W), key=key).window == W
    lm = ls.BlockStateTransformerLM(
        VOCAB, DIM, 2, num_heads=HEADS, window=np.int64(W), bst_layers=np.array([1]), key=key
    )
    assert [type(layer).__name__ for layer in lm.layers] == [
        "SlidingWindowLayer",
        "BlockStateTransformerLayer",
    ]
    # generate's own checks (jaxtyping's annotations reject the non-integers first).
    prompt = jnp.zeros((3,), jnp.int32)
    for kw, message in [
        (dict(steps=-1), "steps must be an integer >= 0, got steps=-1"),
        (dict(steps=2.0), "steps must be an integer >= 0, got steps=2.0"),
        (dict(steps=2, top_k=0), "top_k must be a positive integer, got top_k=0"),
    ]:
        with pytest.raises(ValueError, match=message):
            ls.generate(sh_lm, prompt, kw.pop("steps"), key=key, **kw)


def test_constructor_and_decoding_arguments_named(sh_lm, zoo, key, no_jaxtyping):
    """Sizes that are not positive integers, non-bool flags and non-sequence layer lists
    are refused by name when built (not by XLA later); so are bad decoding arguments."""
    build = lambda cls, *args, **kw: eqx.filter_eval_shape(cls, *args, key=key, **kw)
    LM = ls.BlockStateTransformerLM
    lm_kw = dict(num_heads=HEADS, window=W)
    for args, kw, message in [
        ((VOCAB, 8.0, 1), lm_kw, "dim=8.0"),
        ((VOCAB, DIM, 1), dict(lm_kw, num_heads=2.0), "num_heads=2.0"),
        ((VOCAB, DIM, 2.0), lm_kw, "num_layers=2.0"),
        ((True, DIM, 1), lm_kw, "vocab_size=True"),
        ((VOCAB, DIM, 1), dict(lm_kw, mlp_dim=0), "mlp_dim=0"),
        (
            (VOCAB, DIM, 2),
            dict(lm_kw, bst_layers=(), recurrent_layers=(1,), num_states=2.0),
            "num_states=2.0",
        ),
    ]:
        with pytest.raises(ValueError, match=message):
            build(LM, *args, **kw)
    with pytest.raises(TypeError, match="tie_embeddings='no'"):
        build(LM, VOCAB, DIM, 1, tie_embeddings="no", **lm_kw)
    with pytest.raises(TypeError, match="bst_layers=1"):
        build(LM, VOCAB, DIM, 2, bst_layers=1, **lm_kw)
    with pytest.raises(ValueError, match="num_heads=True"):
        build(ls.SlidingWindowLayer, DIM, True, W)
    for cls in (
        ls.BlockStateTransformerLayer,
        ls.SlidingWindowLayer,
        ls.BlockRecurrentTransformerLayer,
    ):
        with pytest.raises(ValueError, match="dim=8.0"):
            build(cls, 8.0, HEADS, W)
    with pytest.raises(ValueError, match="streams=True"):
        build(ls.ContextSSM, DIM, 2, True)
    with pytest.raises(ValueError, match="features=2.0"):
        build(ls.ContextSSM, DIM, 2.0, 1)
    with pytest.raises(ValueError, match=r"`dim`=2 is too small .*dim // 4.*ssm_features"):
        build(ls.BlockStateTransformerLayer, 2, 1, W)
    with pytest.raises(ValueError, match="ssm_features must be a positive integer.*=0"):
        build(LM, VOCAB, DIM, 1, num_heads=HEADS, window=W, ssm_features=0)
    with pytest.raises(ValueError, match=r"`x` must have shape \(length, dim\).*shape \(8,\)"):
        zoo["sh:s4"].ssm(jnp.zeros(DIM))
    for bad in (0, -1, 2.5, None):
        for model in (sh_lm, zoo["slide"], zoo["brect"], zoo["sh:s4"], zoo["mf:unstruct"]):
            with pytest.raises(ValueError, match=f"max_length={bad}"):
                model.init_cache(bad)
    cache = sh_lm.init_cache(W)
    for bad in (jnp.array([3]), jnp.array(True)):
        with pytest.raises(ValueError, match="`token` must be a scalar integer token"):
            sh_lm.step(cache, bad)
    with pytest.raises(TypeError, match="`token` must hold integer tokens.*float32"):
        sh_lm.step(cache, jnp.array(2.0))
    with pytest.raises(TypeError, match="`x` must be a floating-point array, got dtype int32"):
        zoo["sh:s4"].ssm(jnp.zeros((W, DIM), jnp.int32))
    # Layer steps take what their `__call__` takes (NumPy), and name what they refuse.
    for name in ("slide", "brect", "sh:s4"):
        layer = zoo[name]
        cache, x_t = layer.init_cache(W), np.linspace(-1, 1, DIM, dtype=np.float32)
        for got, want in zip(
            layer.step(cache, x_t, 0), layer.step(cache, jnp.asarray(x_t), 0), strict=True
        ):
            assert eqx.tree_equal(got, want), name
        with pytest.raises(TypeError, match="x_t must be a JAX or NumPy array"):
            layer.step(cache, [0.0] * DIM, 0)
        with pytest.raises(TypeError, match="`x_t` must be a floating-point array.*int32"):
            layer.step(cache, jnp.zeros(DIM, jnp.int32), 0)
    with pytest.raises(TypeError, match="key must be one JAX PRNG key.*key=0"):
        ls.generate(sh_lm, jnp.zeros((3,), jnp.int32), 2, key=0)


def test_narrow_token_dtypes(getkey):
    """uint8 / int16 tokens are checked against the vocabulary in a wide type: bytes of
    a 300-token model are valid (256 does not wrap to 0 in uint8), 300 is not."""
    lm = ls.BlockStateTransformerLM(
        300, DIM, 1, num_heads=HEADS, window=W, bst_layers=(), key=getkey()
    )
    tokens = jnp.array([97, 98, 250, 255], jnp.uint8)
    np.testing.assert_allclose(lm(tokens), lm(tokens.astype(jnp.int32)), atol=1e-6)
    _, logits = lm.step(lm.init_cache(W), jnp.uint8(200))
    np.testing.assert_allclose(logits, lm.step(lm.init_cache(W), jnp.int32(200))[1], atol=1e-6)
    narrow = jnp.array([1, 300, 2, 3], jnp.int16)
    assert_check_fails(r"tokens: ids must be in \[0, vocab_size=300\)", lm, narrow)
    # NumPy int64 ids are checked before JAX's 32-bit conversion, which would wrap
    # 2**32 + 1 to the valid id 1.
    wrapped = np.array([2**32 + 1, 2, 3, 4], np.int64)
    with pytest.raises(ValueError, match=r"tokens: ids must be in .* got id 4294967297"):
        lm(wrapped)
    with pytest.raises(ValueError, match=r"token: ids must be in .* got id 4294967297"):
        lm.step(lm.init_cache(W), wrapped[0])
    for steps in (0, 2):
        with pytest.raises(ValueError, match=r"prompt: ids must be in .* got id 4294967297"):
            ls.generate(lm, wrapped[:1], steps, key=getkey())
    np.testing.assert_array_equal(lm(wrapped % 2**32), lm(jnp.array([1, 2, 3, 4])))


def test_generate_top_k_keeps_exactly_k_tokens_under_ties(getkey):
    """Tokens 5 and 6 tie for the largest logit: `top_k=1` is greedy (always 5, the
    lower id), not a draw between the tied tokens."""
    lm = ls.BlockStateTransformerLM(
        VOCAB, DIM, 1, num_heads=HEADS, window=W, bst_layers=(), tie_embeddings=False,
        key=getkey(),
    )  # fmt: skip
    head = lm.head
    head = eqx.tree_at(lambda h: h.weight, head, head.weight.at[6].set(head.weight[5]))
    head = eqx.tree_at(lambda h: h.bias, head, jnp.zeros(VOCAB).at[5:].set(10.0))
    lm = eqx.tree_at(lambda m: m.head, lm, head)
    prompt = jnp.array([1, 2])
    for seed in range(8):
        out = ls.generate(lm, prompt, 4, key=jr.key(seed), top_k=1)
        np.testing.assert_array_equal(out[2:], 5)


def test_decoding_under_x64_is_float64_accurate():
    """A float64 model (built under x64) decodes in float64: its attention steps do not
    go through float32 logits (`jax.nn.dot_product_attention` computes them in float32)."""
    with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
        lm = ls.BlockStateTransformerLM(
            VOCAB, DIM, 3, num_heads=HEADS, window=W, bst_layers=(1,), recurrent_layers=(2,),
            state_size=4, mlp_dim=16, key=jr.key(3),
        )  # fmt: skip
        assert lm.embedding.weight.dtype == jnp.float64
        tokens = jr.randint(jr.key(4), (2 * W,), 0, VOCAB)
        forward = _forward_pair(lm, tokens[None])[0]
        np.testing.assert_allclose(_decode(lm, tokens), forward, rtol=0, atol=1e-12)


def test_unstruct_decoding_stops_at_the_cache_length(zoo, stack):
    """UNSTRUCT layers store the inputs of `init_cache(max_length)`: decoding past it (or
    at a negative position) is an error (it used to give NaN logits), at once for a
    concrete position, at run time for a traced one."""
    layer = zoo["sh:unstruct"]
    cache = layer.init_cache(W)
    cache, _ = layer.step(cache, jnp.zeros(DIM), jnp.asarray(W - 1))
    with pytest.raises(ValueError, match="`t`=4 is past the end: the decoding state holds 4"):
        layer.step(cache, jnp.zeros(DIM), jnp.asarray(W))
    step = eqx.filter_jit(layer.step)
    x = jnp.zeros(DIM)
    assert_check_fails("decoding state holds 4 positions", step, cache, x, jnp.asarray(W))
    # A traced negative position wrote the last stored input (`.at[-1]`) and decoded on.
    assert_check_fails("position is negative or past the end", step, cache, x, jnp.asarray(-1))
    cache = stack.init_cache(2)
    with pytest.raises(ValueError, match=r"`cache\['t'\]`=2 is past the end.*holds 2 positions"):
        stack.step({**cache, "t": jnp.asarray(2, jnp.int32)}, 0)


def test_step_position_and_cache_named(zoo, sh_lm, key, no_jaxtyping):
    """`step` refuses a position that is not a scalar integer >= 0 and a cache that is
    not its own (another layer kind's, width's, window's or number of states'), by name,
    when traced too; it used to fail in XLA, raise a bare KeyError, or decode on
    (t=-1, another layer's cache)."""
    x = jnp.zeros(DIM)
    layers = [zoo[v] for v in ("slide", "brect", "sh:s4", "mf:unstruct")]
    caches = [layer.init_cache(L) for layer in layers]
    for layer, cache in zip(layers, caches, strict=True):
        name = type(layer).__name__
        for bad in (2.5, jnp.asarray(2.5), jnp.array([1, 2]), True, None):
            with pytest.raises(ValueError, match="`t` must be a scalar integer position, got t="):
                layer.step(cache, x, bad)
        for bad in (-1, jnp.asarray(-1), np.int64(2**31)):
            with pytest.raises(ValueError, match=r"`t` must be a position in \[0, 2\*\*31\)"):
                layer.step(cache, x, bad)
        for other in ({}, None, *(c for c in caches if c is not cache)):
            with pytest.raises(ValueError, match=f"`cache` must be a decoding state from {name}"):
                layer.step(other, x, 0)
        # Checked when traced: the cache's shapes and the position's type are static.
        eqx.filter_eval_shape(layer.step, cache, x, jnp.asarray(1))
        with pytest.raises(ValueError, match="`t` must be a scalar integer position"):
            eqx.filter_eval_shape(layer.step, cache, x, jnp.asarray(1.0))
    wide = eqx.filter_eval_shape(ls.SlidingWindowLayer, 2 * DIM, HEADS, W, key=key)
    long = eqx.filter_eval_shape(ls.SlidingWindowLayer, DIM, HEADS, 2 * W, key=key)
    more = eqx.filter_eval_shape(ls.BlockRecurrentTransformerLayer, DIM, HEADS, W, key=key)
    for layer, other, message in [
        (zoo["slide"], wide, r"`cache\['frame'\]\['k'\]` must have shape \(8, 2, 4\).*\(8, 2, 8\)"),
        (
            zoo["slide"],
            long,
            r"`cache\['frame'\]\['k'\]` must have shape \(8, 2, 4\).*\(16, 2, 4\)",
        ),
        (zoo["brect"], more, r"`cache\['ks'\]` must have shape \(3, 2, 4\).*\(4, 2, 4\)"),
    ]:
        with pytest.raises(ValueError, match=message):
            other_cache = eqx.filter_eval_shape(lambda m: m.init_cache(L), other)
            eqx.filter_eval_shape(layer.step, other_cache, x, jnp.asarray(0))
    # The LM: its cache and the position it holds.
    cache = sh_lm.init_cache(L)
    for bad, message in [
        ({}, "`cache` must be a decoding state from BlockStateTransformerLM.init_cache"),
        (zoo["slide"].init_cache(L), "`cache` must be a decoding state"),
        ({**cache, "t": jnp.asarray(1.5)}, r"`cache\['t'\]` must have shape \(\) and dtype int32"),
        ({**cache, "t": np.int64(1)}, r"`cache\['t'\]` must .* dtype int64 \(cast it\)"),
        ({**cache, "t": jnp.asarray(-1, jnp.int32)}, r"`cache\['t'\]` must be a position"),
        ({**cache, "layers": cache["layers"][:1]}, r"lacks cache\['layers'\]\[1\]"),
    ]:
        with pytest.raises(ValueError, match=message):
            sh_lm.step(bad, 0)


def test_step_takes_python_and_numpy_positions(zoo):
    """A Python or NumPy integer position steps as a JAX one does (the annotations admit
    them; they refused it), and the SSM sublayer takes NumPy inputs as its layer does."""
    layer, x = zoo["sh:s4"], jnp.ones(DIM)
    cache = layer.init_cache(L)
    want = layer.step(cache, x, jnp.asarray(5))[1]
    for t in (5, np.int64(5), np.asarray(5, np.int32)):
        np.testing.assert_allclose(layer.step(cache, x, t)[1], want, rtol=1e-6)
    ssm, xs = layer.ssm, jr.normal(jr.key(5), (L, DIM))
    np.testing.assert_allclose(ssm(np.asarray(xs)), ssm(xs), rtol=1e-6)
    np.testing.assert_allclose(ssm.block_ends(np.asarray(xs), W), ssm.block_ends(xs, W), rtol=1e-6)
    state = ssm.init_state(L)
    np.testing.assert_allclose(
        ssm.step(state, np.asarray(xs[0]), 0)[1], ssm.step(state, xs[0], 0)[1]
    )
    with pytest.raises(
        ValueError, match="`state` must be a decoding state from ContextSSM.init_state"
    ):
        ssm.step({}, xs[0], 0)


def test_context_ssm_inputs_named(zoo, no_jaxtyping):
    """The SSM sublayer takes JAX and NumPy arrays (see above); `None` or a list is
    refused by name (they failed on a missing `.ndim`)."""
    ssm = zoo["sh:s4"].ssm
    for bad in (None, [[0.0] * DIM] * W):
        with pytest.raises(TypeError, match=r"x must be a JAX or NumPy array, got x="):
            ssm(bad)
        with pytest.raises(TypeError, match=r"x must be a JAX or NumPy array, got x="):
            ssm.block_ends(bad, W)
    with pytest.raises(TypeError, match=r"x_t must be a JAX or NumPy array, got x_t=None"):
        ssm.step(ssm.init_state(L), None, 0)


def test_sizes_checked_whatever_the_variant(key):
    """Every size (and S4 option) given to the LM is checked when it is built, also where
    no layer uses it: they used to pass silently (a SLIDE model's `num_states=0`)."""
    build = lambda cls, *args, **kw: eqx.filter_eval_shape(cls, *args, key=key, **kw)
    slide = dict(num_heads=HEADS, window=W, bst_layers=())
    for kw, message in [
        (dict(slide, num_states=0), "num_states must be a positive integer, got num_states=0"),
        (dict(slide, num_filters=-1), "num_filters must be a positive integer, got num_filters=-1"),
        (dict(slide, max_length=0), "max_length must be a positive integer, got max_length=0"),
        (dict(slide, ssm_features=0), "ssm_features must be a positive integer"),
        (dict(slide, state_size=0), "state_size must be a positive even integer"),
        (dict(slide, dt_min=-1.0), "dt_min must be a positive, finite real number"),
        (dict(num_heads=HEADS, window=W, num_filters=-1), "num_filters=-1"),  # SH
        (dict(num_heads=HEADS, window=W, max_length=0), "max_length=0"),  # S4
    ]:
        with pytest.raises(ValueError, match=message):
            build(ls.BlockStateTransformerLM, VOCAB, DIM, 2, **kw)
    with pytest.raises(ValueError, match="num_filters must be a positive integer"):
        build(ls.BlockStateTransformerLayer, DIM, HEADS, W, num_filters=-1)
    with pytest.raises(ValueError, match="max_length must be None or a positive integer"):
        build(ls.BlockStateTransformerLayer, DIM, HEADS, W, max_length=0)
    with pytest.raises(ValueError, match="max_length must be None or a positive integer"):
        build(ls.ContextSSM, DIM, 2, 1, max_length=-4)


def test_s4_decoding_state_dtype_under_x64():
    """Under `jax_enable_x64` the S4 state stays complex128 through `step` (a scan's
    carry must keep its type)."""
    with jax.enable_x64(True):
        ssm = ls.ContextSSM(DIM, 2, 1, state_size=4, key=jr.key(0))
        state = ssm.init_state(L)
        new, _ = eqx.filter_eval_shape(ssm.step, state, jnp.zeros(DIM), jnp.asarray(0))
    assert state["s4"].dtype == new["s4"].dtype == jnp.complex128


@pytest.mark.parametrize(
    "variant,options",
    [
        ("SLIDE", {"tie_embeddings": False}),
        ("BRECT", {"num_states": 3}),
        ("BST:SH:S4", {"state_size": 8, "dt_min": 0.01, "mlp_dim": 20}),
        ("BST:MF:UNSTRUCT", {"max_length": 32, "num_filters": 5, "ssm_features": 3}),
    ],
)
def test_config_rebuilds_the_model_for_a_checkpoint(tmp_path, variant, options):
    """`config()` is JSON, and the model it builds is a template that loads the saved
    weights (every leaf's path, shape and dtype match) without a warning about static
    fields, and reports the same config."""
    lm = ls.BlockStateTransformerLM.from_variant(
        variant, 11, 16, 4, num_heads=2, window=4, key=jr.key(0), **options
    )
    config = json.loads(json.dumps(lm.config()))
    template = eqx.filter_eval_shape(lambda: ls.BlockStateTransformerLM(**config, key=jr.key(1)))
    ls.save_checkpoint(tmp_path, 0, model=lm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = ls.load_checkpoint(tmp_path, model=template).model
    assert loaded.config() == config
    for a, b in zip(jax.tree.leaves(lm), jax.tree.leaves(loaded), strict=True):
        np.testing.assert_array_equal(a, b)
    # An eqx.filter_vmap ensemble's config is its models' (BRECT read its states off the
    # leading axis, the ensemble's, as num_states).
    build = lambda k: ls.BlockStateTransformerLM(**config, key=k)  # noqa: E731
    assert eqx.filter_eval_shape(eqx.filter_vmap(build), jr.split(jr.key(2), 2)).config() == config
