"""Every model family on a mesh gives the numbers of one device.

S4D, BiGS, the Block-State Transformer and the Koopman autoencoder, each with one
jitted function (outputs, a scalar loss and its gradient), run once on one device and
once on a `(data=4, model=2)` mesh of the 8 host CPU devices: parameters split over
"model" by `ls.shard_params` (with a `min_shard_size` small enough that these tiny models
really are split), the batch over "data" by `ls.shard_batch`. The two runs sum in a
different order, so they agree to float32 rounding, not bit for bit. XLA must not have
printed an "involuntary full rematerialization" warning while compiling them.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
import pytest
from _devices import needs_8_devices
from _scripts import run_script, xla_flags
from jax.flatten_util import ravel_pytree
from jax.sharding import PartitionSpec as P

import lineax_seq as ls

pytestmark = needs_8_devices

DATA, MODEL = 4, 2  # the mesh's axis sizes
BATCH = 2 * DATA  # two examples per "data" shard
MIN_SIZE = 64  # split every weight matrix of at least 64 entries over "model"


@pytest.fixture(scope="module")
def mesh():
    return ls.make_mesh(DATA, MODEL)


def _leaves(tree):
    return jax.tree.leaves(eqx.filter(tree, eqx.is_array))


def _spec_axes(sharding) -> set:
    axes = set()
    for entry in sharding.spec:
        axes.update(entry if isinstance(entry, tuple) else (entry,))
    return axes - {None}


def place(model, batch, mesh):
    """`(model, batch)` on the mesh; asserts that the weights really were split."""
    model = ls.shard_params(model, mesh, min_shard_size=MIN_SIZE)
    split = [x for x in _leaves(model) if "model" in _spec_axes(x.sharding)]
    assert split, "no parameter was split over 'model'"
    for x in split:
        assert {s.data.size for s in x.addressable_shards} == {x.size // MODEL}
    return model, ls.shard_batch(batch, mesh)


def assert_batch_sharded(out):
    """The leading (batch) axis of every output stays split over "data"."""
    for x in jax.tree.leaves(out):
        assert "data" in _spec_axes(x.sharding), x.sharding
        assert {s.data.shape[0] for s in x.addressable_shards} == {x.shape[0] // DATA}


def assert_close(got, want, rtol=1e-5, atol=1e-5):
    """Leafwise `|got - want| <= atol * max|want| + rtol * |want|` (per leaf)."""
    got_leaves, want_leaves = _leaves(got), _leaves(want)
    assert len(got_leaves) == len(want_leaves)
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and np.isfinite(w).all()
        scale = float(np.abs(w).max(initial=0.0))
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * scale, err_msg=f"leaf {i}")


def assert_no_resharding(capfd):
    """XLA printed no "involuntary full rematerialization" (a value it could only
    replicate, e.g. from one device, and then split again) while compiling."""
    err = capfd.readouterr().err
    assert "rematerialization" not in err, err


def run_both(run, model, batch, mesh):
    """`run(model, batch) -> (outputs, loss, grads)` on one device, then on the mesh:
    `(on_mesh, on_one_device)`."""
    want = run(model, batch)
    got = run(*place(model, batch, mesh))
    return got, want


# --------------------------------------------------------------------------- S4D


@eqx.filter_jit
def s4d_run(layer, x):
    def loss(layer):
        y = jax.vmap(layer)(x)
        return jnp.mean(jnp.sin(y)), y

    (value, y), grads = eqx.filter_value_and_grad(loss, has_aux=True)(layer)
    return y, value, grads


def test_s4d_on_mesh(mesh, capfd):
    layer = ls.S4D(16, state_size=32, activation=jax.nn.gelu, glu=True, key=jr.key(0))
    x = jr.normal(jr.key(1), (BATCH, 24, 16))
    got, want = run_both(s4d_run, layer, x, mesh)
    assert_no_resharding(capfd)
    assert got[0].shape == x.shape
    assert_batch_sharded(got[0])
    assert_close(got, want)


# -------------------------------------------------------------------------- BiGS


@eqx.filter_jit
def bigs_run(model, batch):
    tokens, mask, keys = batch

    def loss(model):
        h = jax.vmap(lambda t, m, k: model(t, m, key=k))(tokens, mask, keys)
        real = jnp.where(mask[..., None], jnp.tanh(h), 0.0)
        return jnp.sum(real) / jnp.sum(mask, dtype=h.dtype), h

    (value, h), grads = eqx.filter_value_and_grad(loss, has_aux=True)(model)
    return h, value, grads


def test_bigs_on_mesh(mesh, capfd):
    model = ls.BiGS.from_config(
        "bigs-tiny", vocab_size=50, dim=16, inner_dim=32, state_size=16, key=jr.key(0)
    )
    length = 12
    tokens = jr.randint(jr.key(1), (BATCH, length), 0, 50)
    lengths = jnp.array([12, 5, 9, 12, 1, 7, 12, 3])
    mask = jnp.arange(length) < lengths[:, None]
    keys = jax.vmap(jr.key_data)(jr.split(jr.key(2), BATCH))  # dropout on
    got, want = run_both(bigs_run, model, (tokens, mask, keys), mesh)
    assert_no_resharding(capfd)
    assert_batch_sharded(got[0])
    assert_close(got, want)
    h = np.asarray(got[0])
    assert (h[~np.asarray(mask)] == 0).all()  # padding stays exactly zero


def test_bigs_train_step_with_padding_on_mesh(mesh):
    """`make_train_step` on the mesh with padded examples completes (its run-time mask
    check, as a host callback on one device, once deadlocked this step's all-reduce) and
    updates the weights as on one device."""
    make = lambda: ls.BiGS(50, 16, 1, dropout=0.0, key=jr.key(0))  # steps donate them
    opt = optax.sgd(0.5)  # (Adam would magnify the rounding of near-zero gradients)
    tokens = jr.randint(jr.key(1), (BATCH, 8), 0, 50)
    mask = jnp.arange(8) < jnp.array([8, 3, 5, 8, 1, 6, 8, 2])[:, None]

    def loss_fn(model, batch, key):
        tokens, mask = batch
        h = jax.vmap(lambda t, m: model(t, m, inference=True))(tokens, mask)
        return jnp.mean(h**2), None

    step = ls.make_train_step(loss_fn, opt, mesh=mesh, min_shard_size=16)
    sharded = ls.shard_params(make(), mesh, min_shard_size=16)
    state = ls.shard_params(
        opt.init(eqx.filter(sharded, eqx.is_inexact_array)), mesh, min_shard_size=16
    )
    got, _, metrics = step(sharded, state, ls.shard_batch((tokens, mask), mesh), jr.key(2))
    model = make()
    one = ls.make_train_step(loss_fn, opt)
    want, _, expected = one(model, opt.init(eqx.filter(model, eqx.is_inexact_array)),
                            (tokens, mask), jr.key(2))  # fmt: skip
    np.testing.assert_allclose(metrics["loss"], expected["loss"], rtol=1e-5)
    # All weights at once: some leaves' gradients are zero up to rounding (1e-8).
    flat = lambda m: ravel_pytree(eqx.filter(m, eqx.is_inexact_array))[0]
    np.testing.assert_allclose(flat(got), flat(want), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------- Block-State Transformer


@eqx.filter_jit
def bst_run(lm, tokens):
    def loss(lm):
        logits = jax.vmap(lm)(tokens)
        logp = jax.nn.log_softmax(logits[:, :-1])
        nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)
        return jnp.mean(nll), logits

    (value, logits), grads = eqx.filter_value_and_grad(loss, has_aux=True)(lm)
    return logits, value, grads


def test_bst_on_mesh(mesh, capfd):
    lm = ls.BlockStateTransformerLM.from_variant(
        "BST:SH:S4", 7, 8, 2, num_heads=2, window=4, bst_layers=(0,), key=jr.key(7)
    )
    tokens = jr.randint(jr.key(1), (BATCH, 16), 0, 7)
    got, want = run_both(bst_run, lm, tokens, mesh)
    assert_no_resharding(capfd)
    assert_batch_sharded(got[0])
    assert_close(got, want)
    # Greedy incremental decoding (one sequence) with the split weights: same tokens.
    prompt = tokens[0, :3]
    want = ls.generate(lm, prompt, 9, key=jr.key(3), temperature=0.0)
    lm_mesh = ls.shard_params(lm, mesh, min_shard_size=MIN_SIZE)
    got = ls.generate(lm_mesh, prompt, 9, key=jr.key(3), temperature=0.0)
    assert_no_resharding(capfd)
    np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------- Koopman autoencoder


@eqx.filter_jit
def koopman_run(model, batch):
    xs, actions = batch

    def loss(model):
        losses, _ = jax.vmap(lambda x, u: ls.koopman_loss(model, x, u, reencode_every=3))(
            xs, actions
        )
        return jnp.mean(losses)

    value, grads = eqx.filter_value_and_grad(loss)(model)
    pred = jax.vmap(lambda x0, u: ls.unroll(model, x0, u, steps=u.shape[0]))(xs[:, 0], actions)
    return pred, value, grads


def test_koopman_on_mesh(mesh, capfd):
    model = ls.KoopmanAutoencoder(2, 16, action_dim=1, action_latent_dim=4, width=16, key=jr.key(1))
    xs = jr.normal(jr.key(2), (BATCH, 8, 2))
    actions = jr.normal(jr.key(3), (BATCH, 7, 1))
    got, want = run_both(koopman_run, model, (xs, actions), mesh)
    assert_no_resharding(capfd)
    assert got[0].shape == (BATCH, 7, 2)  # the 7 states after x0, one per action
    assert_batch_sharded(got[0])
    assert_close(got, want)


# --------------------------------------------------------------------------- failed checks

# Each case fails one run-time check on the (data=4, model=2) mesh, then runs again on
# good input (the runtime still works). Before the checks were mesh-safe, the callback of
# `eqx.error_if` raised on one device while the others waited in a collective, and XLA
# aborted the process after 40 s.
_FAILED_CHECKS = """
import jax, jax.numpy as jnp, jax.random as jr, numpy as np, optax
import lineax_seq as ls
from lineax_seq._checks import fail_if

mesh = ls.make_mesh(4, 2)


def expect(name, message, run, bad, good):
    try:
        jax.block_until_ready(run(bad))
    except Exception as e:
        assert message in str(e), str(e)
    else:
        raise AssertionError(f"{name}: no error")
    jax.block_until_ready(run(good))
    print("raised:", name, flush=True)


model = ls.shard_params(ls.BiGS(10, 16, 1, key=jr.key(0)), mesh, min_shard_size=16)
tokens = jr.randint(jr.key(1), (8, 12), 0, 10)
mask = jnp.arange(12) < jnp.array([12, 9, 12, 5, 12, 12, 3, 12])[:, None]
opt = optax.sgd(0.1)
loss_fn = lambda m, b, key: (jnp.mean(jax.vmap(m)(*b) ** 2), None)
step = ls.make_train_step(loss_fn, opt, mesh=mesh, min_shard_size=16, donate=False)
state = opt.init(model)
train = lambda b: step(model, state, ls.shard_batch(b, mesh), jr.key(2))
ids, holes = tokens.at[5, 3].set(10), mask.at[2, 4].set(False)
expect("BiGS train step, token id", "ids must be in [0, vocab_size=10)", train,
       (ids, mask), (tokens, mask))
expect("BiGS train step, mask", "mask must be trailing padding", train,
       (tokens, holes), (tokens, mask))

koopman = ls.KoopmanAutoencoder(2, 8, width=16, encoder_layers=2, key=jr.key(3))
ts = jnp.linspace(0.0, 0.1, 5)
x0 = ls.shard_batch(jr.normal(jr.key(4), (8, 2)), mesh)
solve = lambda steps: jax.jit(
    jax.vmap(lambda x: ls.unroll_continuous(koopman, x, ts, max_steps=steps))
)(x0)
expect("unroll_continuous, max_steps", "the ODE solve reached max_steps=1", solve, 1, 4096)
loss = jax.jit(lambda xs: jax.vmap(lambda x: ls.koopman_loss(koopman, x)[0])(xs).mean())
xs = ls.shard_batch(jr.normal(jr.key(5), (8, 6, 2)), mesh)
expect("koopman_loss, NaN", "xs contains NaN or inf", loss, xs.at[6, 2, 0].set(jnp.nan), xs)

spec = jax.sharding.PartitionSpec("data")
local = jax.jit(
    jax.shard_map(
        lambda x: (fail_if(x > 6, "too large"), jax.lax.psum(x.sum(), "data"))[1],
        mesh=mesh, in_specs=spec, out_specs=jax.sharding.PartitionSpec(),
    )
)
expect("shard_map, one shard", "too large", local, jnp.arange(8.0), jnp.zeros(8))
"""


def test_failed_checks_raise_on_a_mesh(tmp_path):
    """A run-time check that fails on a mesh raises an error that names the problem, in
    a train step, a Diffrax solve, a loss and under `shard_map` (in a fresh process of 8
    CPU devices: a regression would abort the process)."""
    script = tmp_path / "failed_checks.py"
    script.write_text(_FAILED_CHECKS)
    env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags(8)}
    out = run_script(script, tmp_path, env)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    for name in ("token id", "mask", "max_steps", "NaN", "one shard"):
        assert f"{name}\n" in out.stdout, out.stdout


# ------------------------------------------------------------------ inside shard_map


def test_decoding_loops_inside_shard_map():
    """A loop carry started from parameters (BRECT's initial states, a decoding cache)
    and updated with per-device data failed `shard_map`'s type check ("carry input and
    carry output must have equal types ... {V:data}"); the carries now vary as the data.
    So do those of `generate`'s token-by-token prompt (a cuDNN-attention model off a GPU:
    "cond branches must have equal output types") and of BRECT's step between block
    ends; a decoding loop written by hand starts from a cache made varying as the
    distributed guide shows. Inside `shard_map` the three decoders agree with each
    other and with the parallel forward pass (each is checked against the others on
    one device by tests/test_bst.py)."""
    mesh = ls.make_mesh(8, 1)
    tokens = jr.randint(jr.key(1), (8, 8), 0, 11)
    variants = ("BRECT", "BST:SH:S4", "BST:MF:S4", "BST:MH:UNSTRUCT", "SLIDE")
    for i, variant in enumerate(variants):
        extra = dict(max_length=8) if variant.endswith("UNSTRUCT") else {}
        # cuDNN attention needs a GPU for the parallel pass: here `generate` feeds the
        # prompt token by token, and the model's own forward pass is not run.
        cudnn = variant == "SLIDE"
        if cudnn:
            extra = dict(attention_implementation="cudnn")
        lm = ls.BlockStateTransformerLM.from_variant(
            variant, 11, 16, 2, num_heads=2, window=4, mlp_dim=32, key=jr.key(i), **extra
        )
        params, static = eqx.partition(lm, eqx.is_array)

        def per_device(params, tokens, static=static, cudnn=cudnn):
            model = eqx.combine(params, static)
            sample = lambda t: ls.generate(model, t[:3], 5, key=jr.key(0), temperature=0.0)
            # Hand-written decoding: one step, and a scan from a cache made varying.
            first = lambda t: model.step(model.init_cache(8), t[0])[1]
            cache = jax.lax.pcast(model.init_cache(8), "data", to="varying")
            scan = lambda t: jax.lax.scan(lambda c, x: model.step(c, x), cache, t)[1]
            sampled = jax.vmap(sample)(tokens)
            stepped = jax.vmap(scan)(sampled)
            logits = stepped if cudnn else jax.vmap(model)(sampled)
            return sampled, logits, stepped, jax.vmap(first)(sampled)

        replicated = jax.tree.map(lambda _: P(), params)
        run = jax.jit(
            jax.shard_map(
                per_device, mesh=mesh, in_specs=(replicated, P("data")), out_specs=P("data")
            )
        )
        sampled, logits, stepped, first = run(params, tokens)
        np.testing.assert_array_equal(sampled[:, :3], tokens[:, :3], err_msg=variant)
        # Greedy sampling took a largest logit of the forward pass at every step.
        chosen = jnp.take_along_axis(logits[:, 2:-1], sampled[:, 3:, None], axis=-1)
        assert (chosen[..., 0] >= logits[:, 2:-1].max(-1) - 1e-5).all(), variant
        # The recurrent decoding off the mesh (one device) is the reference.
        plain = lambda m, t: jax.lax.scan(lambda c, x: m.step(c, x), m.init_cache(8), t)[1]
        want = eqx.filter_jit(jax.vmap(plain, in_axes=(None, 0)))(lm, sampled)
        pairs = [(stepped, want), (first, want[:, 0])] + ([] if cudnn else [(logits, want)])
        for got, expected in pairs:
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5, err_msg=variant)


def test_param_sharding_of_an_abstract_model(mesh):
    """Shardings for a model built with `eqx.filter_eval_shape` (to create it directly
    sharded) were all None: its leaves are ShapeDtypeStructs, not arrays. The recipe in
    `param_sharding`'s docstring builds such a model: `jax.jit(make_model,
    out_shardings=...)` failed on the Koopman autoencoder's activation function and
    turned BiGS's dropout flags into arrays."""
    makers = {
        "bigs": lambda: ls.BiGS.from_config("bigs-tiny", vocab_size=64, key=jr.key(0)),
        "koopman": lambda: ls.KoopmanAutoencoder(2, 8, width=64, dt=0.1, key=jr.key(0)),
    }
    inputs = {"bigs": (jnp.arange(16) % 64,), "koopman": (jnp.ones(2),)}
    for name, make in makers.items():
        abstract = eqx.filter_eval_shape(make)
        got = ls.param_sharding(abstract, mesh, min_shard_size=MIN_SIZE)
        want = ls.param_sharding(make(), mesh, min_shard_size=MIN_SIZE)
        assert jax.tree.structure(got) == jax.tree.structure(want), name
        assert jax.tree.leaves(got) == jax.tree.leaves(want), name
        assert any("model" in _spec_axes(s) for s in jax.tree.leaves(got)), name
        built = jax.jit(lambda make=make: eqx.filter(make(), eqx.is_array), out_shardings=got)()
        assert [x.sharding for x in jax.tree.leaves(built)] == jax.tree.leaves(got), name
        # (Built under jit, some initial values round differently.)
        np.testing.assert_allclose(
            ravel_pytree(built)[0], ravel_pytree(eqx.filter(make(), eqx.is_array))[0], rtol=1e-6
        )
        model = eqx.combine(built, abstract)
        call = (lambda m, x: m(x, inference=True)) if name == "bigs" else (lambda m, x: m(x))
        np.testing.assert_allclose(
            eqx.filter_jit(call)(model, *inputs[name]),
            eqx.filter_jit(call)(make(), *inputs[name]),
            rtol=1e-5,
            atol=1e-6,
            err_msg=name,
        )
