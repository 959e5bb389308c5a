# %% [markdown]
# # Block-State Transformer: long-range language modelling on code
#
# A Block-State Transformer (BST, Fathi et al. 2023) splits a sequence into blocks of
# `W` tokens and runs a block transformer on all blocks **in parallel**. What a block
# cannot see (everything older than the previous block) reaches it through *context
# states* produced by a state-space model (SSM) that reads the whole sequence with one
# long convolution (an FFT, or chunked matrix products with a parallel scan over the
# chunks). Compared with the Block-Recurrent Transformer, which carries state
# vectors from block to block with a sequential loop, nothing in a BST layer is
# sequential.
#
# In this tutorial we
#
# 1. look at one BST layer and its three kinds of context states,
# 2. build a small BST language model from those layers,
# 3. train it briefly on the Python standard library's own source code (byte tokens),
# 4. evaluate it at 4x the training length, which works because S4 kernels are
#    generated for whatever length the model is run at, and
# 5. generate code with the incremental decoder (S4 recurrent state + attention cache).

# %%
import os
import pathlib
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import matplotlib.pyplot as plt
import numpy as np
import optax

import lineax_seq as ls

SMALL = os.environ.get("LINEAX_SEQ_SMALL") == "1"
OUT = pathlib.Path(os.environ.get("LINEAX_SEQ_OUT", "outputs"))
OUT.mkdir(parents=True, exist_ok=True)

# sizes: the SMALL switch keeps the whole script well under a minute on a laptop CPU
WINDOW = 64 if SMALL else 128  # block size W
LENGTH = 4 * WINDOW if SMALL else 8 * WINDOW  # training length L
DIM, LAYERS, HEADS = (64, 2, 4) if SMALL else (128, 3, 4)
STEPS, BATCH = (25, 2) if SMALL else (400, 4)

# %% [markdown]
# ## One BST layer
#
# A `lineax_seq.BlockStateTransformerLayer` maps `(length, dim) -> (length, dim)`
# for any `length` that is a multiple of `W`. Inside, a `lineax_seq.ContextSSM`
# projects the input down (to `dim / 4`; `dim / 8` for `"mf"`) and convolves it with
# S4D kernels over the whole sequence. How its output becomes the keys/values of the
# cross-attention is the `context` option:
#
# - `"sh"` (single head): the SSM outputs at the block's own positions, shared by all
#   heads, under a causal mask;
# - `"mh"` (multi head): one SSM stream per head, each with its own S4D kernel;
# - `"mf"` (multi filter): `S` filters, read at the last position of the previous
#   block, plus learned context IDs; no mask needed.

# %%
key, x_key = jr.split(jr.key(0))
x = jr.normal(x_key, (4 * WINDOW, DIM))


def shapes(context, key):
    layer = ls.BlockStateTransformerLayer(DIM, HEADS, WINDOW, context=context, key=key)
    return layer.ssm(x), layer(x)  # SSM states (length, streams, features); output


for context in ("sh", "mh", "mf"):
    # shapes only (traced abstractly, nothing is computed)
    states, y = eqx.filter_eval_shape(shapes, context, key)
    print(f"{context}: input {x.shape} -> SSM context states {states.shape} -> output {y.shape}")

# %% [markdown]
# Causality: changing the second half of the input leaves the first half of the output
# untouched, although every block attends to SSM states that summarise the whole past.

# %%
layer = ls.BlockStateTransformerLayer(DIM, HEADS, WINDOW, context="sh", key=key)
forward = eqx.filter_jit(lambda layer, x: layer(x))
x_changed = x.at[2 * WINDOW :].set(0.0)
change = jnp.abs(forward(layer, x)[: 2 * WINDOW] - forward(layer, x_changed)[: 2 * WINDOW])
print("max change in the first half:", float(change.max()))

# %% [markdown]
# ## A BST language model from the layers
#
# `lineax_seq.BlockStateTransformerLM` stacks an embedding, `num_layers` block
# transformer layers and a tied LM head. The layers listed in `bst_layers` are BST
# layers; the others are plain sliding-window layers
# (`lineax_seq.SlidingWindowLayer`), so `bst_layers=()` is the SLIDE baseline.
# There are no absolute position embeddings: a T5 relative bias inside each window and
# the SSM carry position, which is what lets the model run at lengths it never saw.
# For that, every SSM mode should settle within a training sequence: the slowest S4D
# mode's time constant is about `2 / dt_min` steps, so `dt_min = 4 / L` puts it at half
# the training length `L` (the ratio of S4's usual `1e-3` to the paper's 4k sequences).
# On an NVIDIA GPU with bfloat16 weights, `attention_implementation="cudnn"` runs the
# attention on cuDNN's fused kernel (a BST:SH layer at 16k tokens ran 2.4x as fast on
# an H200); the default, XLA's, runs anywhere.

# %%
tokenizer = ls.ByteTokenizer()
lm = ls.BlockStateTransformerLM(
    tokenizer.vocab_size,
    DIM,
    LAYERS,
    num_heads=HEADS,
    window=WINDOW,
    bst_layers=(1,),
    context="sh",
    ssm="s4",
    state_size=16,
    dt_min=4 / LENGTH,
    key=jr.key(1),
)
num_params = ls.count_parameters(lm)
print([type(layer).__name__ for layer in lm.layers], f"{num_params / 1e6:.2f}M parameters")

# %% [markdown]
# ## Training on the standard library
#
# `lineax_seq.text_corpus` reads the `.py` files of the running Python's standard
# library (no download) and splits them into train / valid / test by a hash of the
# file name; `lineax_seq.lm_dataset` cuts the byte-tokenised files into shuffled
# windows of `L` tokens. The loop is `lineax_seq.train` with AdamW, warmup and
# cosine decay from `lineax_seq.make_optimizer`.


# %%
def loss_fn(model, batch, key):
    logits = jax.vmap(model)(batch["inputs"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"]).mean()
    return loss, None


data = ls.lm_dataset(
    ls.text_corpus(split="train"), tokenizer, length=LENGTH, batch_size=BATCH, seed=0
)
optimizer = ls.make_optimizer(3e-3, warmup_steps=STEPS // 10, total_steps=STEPS)
start = time.perf_counter()
result = ls.train(lm, optimizer, loss_fn, data, steps=STEPS, key=jr.key(2), log_every=5)
lm = result.model
losses = [r["loss"] for r in result.history if r["split"] == "train"]
print(f"trained {STEPS} steps in {time.perf_counter() - start:.0f} s; last loss {losses[-1]:.3f}")

# %% [markdown]
# ## Evaluating at 4x the training length
#
# We take held-out windows of `4L` bytes from the validation files and score the *same*
# target bytes twice: cut into sequences of `L` (the training length), and whole, at
# `4L`. The S4 kernels are simply generated for `4L`; with longer sequences most tokens
# get more context, so the perplexity should not get worse.

# %%
windows = ls.lm_windows(ls.text_corpus(split="valid"), tokenizer, length=4 * LENGTH)
heldout = [windows[i] for i in range(min(len(windows), 2 if SMALL else 4))]


@eqx.filter_jit
def nll(model, inputs, targets):
    logits = model(inputs)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


perplexity = {}
for length in (LENGTH, 4 * LENGTH):
    total = [
        float(nll(lm, w["inputs"][i : i + length], w["targets"][i : i + length]))
        for w in heldout
        for i in range(0, 4 * LENGTH, length)
    ]
    perplexity[length] = float(np.exp(np.mean(total)))
    print(f"held-out perplexity at length {length:5d}: {perplexity[length]:.3f} (bytes)")

# %% [markdown]
# After so short a training run the two come out about equal (12.46 and 12.42 in one
# run at the default size): the model makes little use of context beyond a few windows
# yet. What the comparison shows is that running at `4L`, with kernels it never saw,
# does not make it worse.

# %% [markdown]
# ## Generating code
#
# `lineax_seq.generate` feeds the prompt through the incremental decoder and then
# samples: every new token costs `O(W + N)` per layer (the attention frame of two
# blocks and the S4D recurrent state), never a pass over the whole prefix. Incremental
# decoding reproduces the parallel forward pass's logits, which `lm.step` (the decoder
# `generate` uses), run over a held-out sequence with `lax.scan`, shows:


# %%
@eqx.filter_jit
def incremental_logits(lm, tokens):
    return jax.lax.scan(lambda c, t: lm.step(c, t), lm.init_cache(tokens.shape[0]), tokens)[1]


tokens = heldout[0]["inputs"][: 2 * WINDOW]
gap = jnp.max(jnp.abs(incremental_logits(lm, tokens) - lm(tokens)))
print(f"incremental vs parallel logits over {tokens.shape[0]} tokens: max |diff| {gap:.1e}")

# %% [markdown]
# A model of this size, trained for minutes, has learned the statistics of bytes in
# Python files (indentation, common letters and short words), not Python: the sample
# shows that decoding works, not what a trained BST writes.

# %%
prompt = jnp.asarray(tokenizer.encode("def __init__(self"))
sample = ls.generate(lm, prompt, 60 if SMALL else 300, key=jr.key(3), temperature=0.8, top_k=20)
print(tokenizer.decode(np.asarray(sample)))

# %%
fig, (ax_loss, ax_ppl) = plt.subplots(1, 2, figsize=(9, 3.5))
ax_loss.plot((np.arange(len(losses)) + 1) * 5, losses)
ax_loss.set_xlabel("step")
ax_loss.set_ylabel("training loss (nats / byte)")
ax_ppl.bar([f"L = {n}" for n in perplexity], list(perplexity.values()))
ax_ppl.set_ylabel("held-out perplexity")
fig.tight_layout()
fig.savefig(OUT / "04_bst.png", dpi=100)
