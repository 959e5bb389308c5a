# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Training an S4D classifier on ListOps — and surviving a crash
#
# This tutorial trains a small bidirectional S4D classifier on
# generated **ListOps** (the Long Range Arena task: evaluate nested `MIN`, `MAX`,
# `MED` and `SM` (sum mod 10) expressions, 10 classes) with `lineax_seq`'s train
# loop, interrupts the run half-way, resumes it, and checks that the resumed run
# is *identical* to one that was never interrupted.
#
# Everything here is plain JAX + Equinox + optax + grain:
#
# * the data are a grain pipeline whose iterator position is checkpointable;
# * `ls.make_optimizer` is optax AdamW with warmup +
#   cosine decay, gradient clipping and a **parameter group** for the SSM kernels
#   (its own learning rate, no weight decay, as in the S4 papers);
# * `ls.train` runs a jitted, buffer-donating step, shows a
#   progress bar, writes `metrics.jsonl`, evaluates, checkpoints atomically and
#   resumes exactly.
#
# The default size runs in about five minutes on a 2-core CPU (expressions of up to 256
# tokens); `LINEAX_SEQ_SMALL=1` gives a run of well under a minute, and
# `LINEAX_SEQ_LRA=1` the Long Range Arena's setting (expressions of 500-2,000 tokens,
# 20,000 steps, twice over: a crashed-and-resumed run and a reference run), which needs
# an accelerator: on a 2-core CPU one step takes 4-7 seconds. There, generating the
# expressions (in Python, ~3 ms each: ~100 ms a batch of 32) may bound the step rate;
# `classification_dataset(..., num_workers=N)` generates them in N processes (grain's,
# so run it from a script under `if __name__ == "__main__":`). The runs go to
# `outputs/02_listops` (`LINEAX_SEQ_OUT=DIR`: `DIR/02_listops`), which each run of the
# tutorial deletes first.

# %%
import json
import os
import pathlib
import shutil

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax

import lineax_seq as ls

SMALL = os.environ.get("LINEAX_SEQ_SMALL") == "1"
LRA = os.environ.get("LINEAX_SEQ_LRA") == "1" and not SMALL
OUT = pathlib.Path(os.environ.get("LINEAX_SEQ_OUT", "outputs")) / "02_listops"
shutil.rmtree(OUT, ignore_errors=True)  # start afresh each time the tutorial runs

if SMALL:
    cfg = dict(
        min_length=16,
        max_length=64,
        max_depth=3,
        num_train=2048,
        num_valid=256,
        dim=32,
        layers=2,
        state_size=16,
        batch=32,
        steps=120,
        eval_every=40,
    )
elif not LRA:
    cfg = dict(
        min_length=64,
        max_length=256,
        max_depth=6,
        num_train=16_000,
        num_valid=1_000,
        dim=64,
        layers=4,
        state_size=32,
        batch=32,
        steps=800,
        eval_every=200,
    )
else:
    cfg = dict(
        min_length=500,
        max_length=2000,
        max_depth=9,  # LRA's trees (its max_depth=10 counts the root at depth 1)
        num_train=96_000,
        num_valid=2_000,
        dim=128,
        layers=6,
        state_size=64,
        batch=32,
        steps=20_000,
        eval_every=1_000,
    )
print(cfg)

# %% [markdown]
# ## Data
#
# `ls.listops` generates expressions such as
# `[MAX 4 3 [MIN 2 3 ] 1 0 ]` lazily and deterministically from `(seed, index)`; a
# different seed gives the validation split. `ls.classification_dataset`
# tokenizes, pads to `max_length`, shuffles, repeats and batches them into
# `{"tokens", "padding_mask", "token_types", "label"}` (ListOps has one segment, so
# `token_types` is all zeros). Its iterator is a grain `DatasetIterator`:
# its position (`get_state()`) goes into every checkpoint.

# %%
tokenizer = ls.ListOpsTokenizer()
shape = dict(min_length=cfg["min_length"], max_length=cfg["max_length"], max_depth=cfg["max_depth"])
train_records = ls.listops(cfg["num_train"], seed=0, **shape)
valid_records = ls.listops(cfg["num_valid"], seed=1, **shape)
example = train_records[0]
tokens = len(tokenizer.encode(example["text"]))
print(f"{example['text'][:100]} ... ({tokens} tokens), label {example['label']}")


def train_data():
    return ls.classification_dataset(
        train_records,
        tokenizer,
        length=cfg["max_length"],
        batch_size=cfg["batch"],
        add_special_tokens=False,
        seed=0,
    )


valid_data = ls.classification_dataset(
    valid_records,
    tokenizer,
    length=cfg["max_length"],
    batch_size=cfg["batch"],
    add_special_tokens=False,
    shuffle=False,
    num_epochs=1,
    drop_remainder=False,  # every example (`ls.train` weights a short last batch)
)
labels = np.array([valid_records[i]["label"] for i in range(cfg["num_valid"])])
majority = np.bincount(labels, minlength=10).max() / len(labels)
print(f"majority-class accuracy on the validation split: {majority:.3f}")


# %% [markdown]
# ## Model
#
# Token embedding, then `layers` pre-norm residual blocks
# `x + S4D(LayerNorm(x))` (bidirectional S4D with GELU and a GLU output map),
# mean-pooled over the non-padding positions, then a linear head. Layers see one
# example at a time; the loss `vmap`s over the batch.


# %%
class ListOpsClassifier(eqx.Module):
    embedding: eqx.nn.Embedding
    norms: list[eqx.nn.LayerNorm]
    blocks: list[ls.S4D]
    head: eqx.nn.Linear

    def __init__(self, vocab_size, num_classes, *, dim, layers, state_size, key):
        keys = jr.split(key, layers + 2)
        self.embedding = eqx.nn.Embedding(vocab_size, dim, key=keys[0])
        self.norms = [eqx.nn.LayerNorm(dim) for _ in range(layers)]
        self.blocks = [
            ls.S4D(
                dim,
                state_size=state_size,
                bidirectional=True,
                activation=jax.nn.gelu,
                glu=True,
                key=k,
            )
            for k in keys[1:-1]
        ]
        self.head = eqx.nn.Linear(dim, num_classes, key=keys[-1])

    def __call__(self, tokens, mask):  # (length,) int32, (length,) bool
        x = jax.vmap(self.embedding)(tokens)
        for norm, block in zip(self.norms, self.blocks, strict=True):
            x = x + block(jax.vmap(norm)(x))
        weights = mask.astype(x.dtype)[:, None]
        pooled = jnp.sum(x * weights, axis=0) / jnp.maximum(jnp.sum(weights), 1.0)
        return self.head(pooled)


def loss_fn(model, batch, key):
    logits = jax.vmap(model)(batch["tokens"], batch["padding_mask"])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
    accuracy = jnp.mean((jnp.argmax(logits, -1) == batch["label"]).astype(jnp.float32))
    return loss, {"accuracy": accuracy}


# %% [markdown]
# ## Optimiser with a parameter group
#
# The S4D kernels (`ls.S4DKernel` modules: log-step sizes, poles, output
# projections) get their own group. `ls.param_labels` shows who is in which group.

# %%
opt = ls.make_optimizer(
    1e-3 if LRA else 1e-2,
    warmup_steps=cfg["steps"] // 10,
    total_steps=cfg["steps"],
    weight_decay=0.05,
    clip_norm=1.0,
    groups={"ssm": ls.ParamGroup(instance_of=ls.S4DKernel, learning_rate=1e-3, weight_decay=0.0)},
)

make_model = eqx.filter_jit(  # one compilation for all the initialisers
    lambda key: ListOpsClassifier(
        tokenizer.vocab_size,
        10,
        dim=cfg["dim"],
        layers=cfg["layers"],
        state_size=cfg["state_size"],
        key=key,
    )
)
model = make_model(jr.key(0))
labels_tree = ls.param_labels(model, {"ssm": ls.ParamGroup(instance_of=ls.S4DKernel)})
sizes = {}
for label, leaf in zip(
    jax.tree.leaves(labels_tree),
    jax.tree.leaves(eqx.filter(model, eqx.is_inexact_array)),
    strict=True,
):
    sizes[label] = sizes.get(label, 0) + leaf.size
print("parameters per group:", sizes)

# %% [markdown]
# ## Train, crash, resume
#
# `ls.train` checkpoints every `checkpoint_every` steps into `out_dir/checkpoints`
# (model, optimiser state, PRNG key and the data iterator's position; written to a
# temporary directory, fsync'ed and atomically renamed, so a crash never leaves a
# half-written checkpoint). We simulate a crash part-way through with a callback
# that raises; `kill -9` behaves the same (the test suite SIGKILLs a training
# process, once mid-run and once in the middle of writing a checkpoint).

# %%
steps, every = cfg["steps"], cfg["eval_every"]
crash_at = steps // 2 + every // 4  # between two checkpoints


class Crash(Exception):
    pass


def crash(step, model, record):
    if step >= crash_at:
        raise Crash(f"simulated crash at step {step}")


run = dict(
    steps=steps,
    key=jr.key(1),
    eval_data=valid_data,
    eval_every=every,
    log_every=10,
    checkpoint_every=every // 2,
    keep_checkpoints=2,
    plot=True,
)
try:
    ls.train(model, opt, loss_fn, train_data(), out_dir=OUT / "run", callback=crash, **run)
except Crash as e:
    print(e)
print("checkpoints on disk:", [p.name for p in ls.list_checkpoints(OUT / "run/checkpoints")])

# %% [markdown]
# Calling `ls.train` again with the same `out_dir` finds the newest intact
# checkpoint, restores everything, rewinds `metrics.jsonl` to that step and carries
# on. The jitted step is cached, so nothing is recompiled.

# %%
result = ls.train(model, opt, loss_fn, train_data(), out_dir=OUT / "run", **run)
print(f"resumed from step {result.resumed_from}, finished at step {result.step}")
final = [r for r in result.history if r["split"] == "eval"][-1]
print(f"validation: loss {final['loss']:.3f}, accuracy {final['accuracy']:.3f}")

# %% [markdown]
# ## Is the resumed run really the same run?
#
# Train once more without interruption and compare every logged training loss:
# on CPU they agree bit for bit, because every step's PRNG key is
# `fold_in(train_key, step)` (`train_key` being split from `key`) and the data
# iterator restarts exactly where it stopped. (On a
# GPU, XLA's reductions need not be bitwise deterministic, so there the losses agree
# to rounding.)

# %%
reference = ls.train(model, opt, loss_fn, train_data(), out_dir=OUT / "reference", **run)


def train_losses(history):
    return np.array([r["loss"] for r in history if r["split"] == "train"])


resumed, uninterrupted = train_losses(result.history), train_losses(reference.history)
same = np.array_equal(resumed, uninterrupted)
print("resumed run identical to the uninterrupted one:", same)
if jax.default_backend() == "cpu":
    assert same
else:
    print(f"largest loss difference: {np.max(np.abs(resumed - uninterrupted)):.2e}")

# %% [markdown]
# ## Curves
#
# `plot=True` saved `curves.png` in the run directory;
# `ls.plot_metrics` draws the same from the history or
# from `metrics.jsonl`. The dotted line marks the resume.

# %%
fig = ls.plot_metrics(result.history, keys=("loss", "accuracy"))
for ax in fig.axes:
    ax.axvline(result.resumed_from, color="grey", linestyle=":", label="resumed")
fig.savefig(OUT / "listops_curves.png", dpi=100)
print("wrote", OUT / "listops_curves.png")
print(json.dumps(final))
