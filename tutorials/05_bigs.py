# %% [markdown]
# # BiGS: pretraining without attention
#
# BiGS (Wang et al., *Pretraining Without Attention*) is a BERT-style encoder whose
# routing is not attention but two **static** state-space convolutions, one running
# forward and one backward, combined by **multiplicative gating**. One layer is
#
# $$
# \begin{aligned}
# X &= \mathrm{LN}(X_i), \quad V = \sigma(W_v X), \quad F = \sigma(W_f X), \quad
#   B = \sigma(W_b\,\mathrm{Flip}(X)),\\
# U_1 &= W_{u_1}\mathrm{SSM}(F), \quad U_2 = W_{u_2}\mathrm{SSM}(B), \quad
#   U = \sigma\big(W_u (U_1 \odot \mathrm{Flip}(U_2))\big),\\
# X_{i+1} &= W_o (U \odot V) + X_i .
# \end{aligned}
# $$
#
# Each SSM is one S4D kernel $K$ shared by all hidden dimensions, so a layer's whole
# routing is two vectors of length $L$, which we can look at (the paper's Figure 3).
#
# This tutorial
#
# 1. pretrains a small BiGS with masked-language modelling on the Python standard
#    library's sources (the default corpus of `lineax_seq.text_corpus`),
# 2. writes a small classification CSV from the same corpus and fine-tunes on it,
# 3. plots each layer's forward and backward kernel over relative positions -10..10,
#    and runs the same weights at a longer length.
#
# The command line does the same at any size:
# `python -m lineax_seq bigs pretrain | finetune | kernels | ablation`.

# %%
import csv
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
start = time.perf_counter()

LENGTH = 64 if SMALL else 128
BATCH = 16
PRETRAIN_STEPS = 40 if SMALL else 800
FINETUNE_STEPS = 40 if SMALL else 300

# %% [markdown]
# ## 1. Data: the stdlib corpus, bytes, BERT masking
#
# `text_corpus()` is the standard library's `.py` files, split into train/valid by a
# stable hash of each file's path. We keep an evenly spaced subset of files and use
# the byte-level tokenizer (263 ids: 7 special tokens + 256 bytes).
# `mlm_dataset` cuts documents into `<cls> chunk <sep>` sequences and masks 15% of
# the tokens (80% `<mask>`, 10% random, 10% unchanged): `labels` holds the original
# token at masked positions and `-100` elsewhere. There is no next-sentence task.

# %%
train_docs = ls.text_corpus(split="train")
valid_docs = ls.text_corpus(split="valid")
pick = lambda docs, n: [docs[int(i)] for i in np.linspace(0, len(docs) - 1, n)]
train_texts = pick(train_docs, 80 if SMALL else 400)
valid_texts = pick(valid_docs, 10 if SMALL else 40)
tokenizer = ls.ByteTokenizer()

mlm_train = ls.mlm_dataset(train_texts, tokenizer, length=LENGTH, batch_size=BATCH, seed=0)
mlm_valid = ls.mlm_dataset(
    valid_texts,
    tokenizer,
    length=LENGTH,
    batch_size=BATCH,
    masking="fixed",
    shuffle=False,
    num_epochs=1,
    drop_remainder=False,  # every example (`ls.train` weights a short last batch)
)
batch = next(iter(mlm_train))
print({k: (v.shape, v.dtype) for k, v in batch.items()})
tokens, labels = batch["tokens"][0], batch["labels"][0]
original = np.where(labels >= 0, labels, tokens)
# `~` (rare in Python source; `_` is everywhere) marks the positions to predict.
masked_view = np.where(labels >= 0, tokenizer.encode("~")[0], original)
print("original:", repr(tokenizer.decode(original[1:-1])[:100]))
print("targets: ", repr(tokenizer.decode(masked_view[1:-1])[:100]))

# %% [markdown]
# ## 2. The model: BiGS encoder + masked-LM head
#
# `ls.BiGS` works on one sequence (`jax.vmap` over a batch). It takes no absolute
# positions: the SSM kernels carry position, and are generated for any length at call
# time. The masked-LM head (dense, GELU, LayerNorm, decoder tied to the token
# embedding) is applied only at the masked positions, the cheap way to score an MLM.
#
# Weights start truncated normal with BERT's std 0.02, which suits the paper's width
# 1,024. A GATED layer multiplies several projected branches, so at `d = 64` its first
# updates would be ~1e-7 of the residual; `init_std = 0.02 * sqrt(1024 / d)` restores
# the paper's scale (what `python -m lineax_seq bigs` uses by default).

# %%
MAX_MASKED = LENGTH // 4  # room enough: mlm_dataset masks max(1, round(0.15 n)) of n tokens


class MaskedLM(eqx.Module):
    encoder: ls.BiGS
    head: ls.MaskedLMHead

    def __call__(self, tokens, padding_mask, positions, *, key=None, inference=False):
        h = self.encoder(tokens, padding_mask, key=key, inference=inference)
        return self.head(h[positions], self.encoder.token_embedding.weight)


def mlm_loss(model, batch, key, inference=False):
    def one(tokens, padding_mask, labels, key):
        (positions,) = jnp.nonzero(labels >= 0, size=MAX_MASKED, fill_value=0)
        valid = jnp.arange(MAX_MASKED) < jnp.sum(labels >= 0)
        logits = model(tokens, padding_mask, positions, key=key, inference=inference)
        targets = jnp.where(valid, labels[positions], 0)
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
        hits = valid & (jnp.argmax(logits, -1) == targets)
        return jnp.sum(jnp.where(valid, nll, 0.0)), jnp.sum(hits), jnp.sum(valid)

    keys = jr.split(key, batch["tokens"].shape[0])
    nll, hits, n = jax.vmap(one)(batch["tokens"], batch["padding_mask"], batch["labels"], keys)
    n = jnp.maximum(jnp.sum(n), 1).astype(jnp.float32)
    return jnp.sum(nll) / n, {"accuracy": jnp.sum(hits).astype(jnp.float32) / n}


k_enc, k_head, k_cls = jr.split(jr.key(0), 3)
# Built under `eqx.filter_jit`: one compiled program instead of many small eager ones.
INIT_STD = 0.02 * (1024 / 64) ** 0.5
make_encoder = lambda k: ls.BiGS(
    tokenizer.vocab_size, dim=64, num_layers=2, dropout=0.1, init_std=INIT_STD, key=k
)
encoder = eqx.filter_jit(make_encoder)(k_enc)
model = MaskedLM(encoder, ls.MaskedLMHead(64, tokenizer.vocab_size, init_std=INIT_STD, key=k_head))
print(f"{ls.count_parameters(model):,} parameters; layers: {type(encoder.layer(0)).__name__}")

# %% [markdown]
# ## 3. Pretraining
#
# The paper's optimiser (Table 7): AdamW with $\beta_2 = 0.98$, $\epsilon = 10^{-6}$,
# no gradient clipping, warmup then cosine decay. The S4D kernel parameters
# ($A$, $B$, $C$, $\Delta t$) form their own group without weight decay, as S4 trains
# them; biases and LayerNorm gains are not decayed either, as in BERT and the paper's
# pretraining script. `ls.train` runs the jitted steps and evaluates at the end.

# %%
no_decay = ls.ParamGroup(match=r"(\.bias|norm\.weight)$", weight_decay=0.0)
optimizer = ls.make_optimizer(
    2e-3,
    schedule="cosine",
    warmup_steps=PRETRAIN_STEPS // 20,
    total_steps=PRETRAIN_STEPS,
    weight_decay=0.01,
    b2=0.98,
    eps=1e-6,
    clip_norm=None,
    groups={
        "ssm": ls.ParamGroup(instance_of=ls.S4DKernel, learning_rate=1e-3, weight_decay=0.0),
        "no_decay": no_decay,
    },
)
result = ls.train(
    model,
    optimizer,
    mlm_loss,
    mlm_train,
    steps=PRETRAIN_STEPS,
    key=jr.key(1),
    eval_data=mlm_valid,
    eval_fn=lambda m, b, k: mlm_loss(m, b, k, inference=True),
    eval_batches=8,
    log_every=max(1, PRETRAIN_STEPS // 20),
    progress=False,
)
model = result.model
mlm_eval = [r for r in result.history if r["split"] == "eval"][-1]

# The context-free baseline: predict every masked byte from unigram frequencies.
counts = np.bincount(np.concatenate([tokenizer.encode(t) for t in train_texts]), minlength=263)
log_p = np.log((counts + 1) / (counts + 1).sum())
targets = np.concatenate(
    [b["labels"][b["labels"] >= 0] for b, _ in zip(mlm_valid, range(8), strict=False)]
)
print(
    f"held-out MLM loss {mlm_eval['loss']:.3f} (unigram {-log_p[targets].mean():.3f}), "
    f"accuracy {mlm_eval['accuracy']:.3f} (unigram {np.mean(targets == counts.argmax()):.3f})"
)

# %% [markdown]
# ## 4. Fine-tuning on a classification file
#
# A (text, label) CSV made from the corpus: which of the four largest training files
# does a 100-character snippet come from? Training snippets come from the first 80%
# of each file, held-out snippets from the last 20%. `read_classification` reads CSV
# or JSONL; `classification_dataset` encodes `<cls> text <sep>`, pads and batches. The
# head pools the real tokens (mean), then dense, tanh, dropout, dense.

# %%
sources = sorted(train_docs[i] for i in range(len(train_docs)))
sources = sorted(sources, key=len)[-4:]
rng = np.random.default_rng(0)


def snippets(split, n, chars=100):
    rows = []
    for i in range(n):
        label = i % len(sources)
        doc = sources[label]
        cut = int(0.8 * len(doc))
        lo, hi = (0, cut) if split == "train" else (cut, len(doc))
        s = int(rng.integers(lo, hi - chars))
        rows.append((doc[s : s + chars], label))
    return rows


for split, n in (("train", 2000), ("valid", 320)):
    with open(OUT / f"bigs_files_{split}.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(snippets(split, n))

records = {
    s: ls.read_classification(OUT / f"bigs_files_{s}.csv", num_classes=4)
    for s in ("train", "valid")
}
cls_train = ls.classification_dataset(records["train"], tokenizer, length=LENGTH, batch_size=BATCH)
cls_valid = ls.classification_dataset(
    records["valid"],
    tokenizer,
    length=LENGTH,
    batch_size=BATCH,
    shuffle=False,
    num_epochs=1,
    drop_remainder=False,
)


class Classifier(eqx.Module):
    encoder: ls.BiGS
    head: ls.SequenceClassificationHead

    def __call__(self, tokens, padding_mask, *, key=None, inference=False):
        k1, k2 = (None, None) if key is None else jr.split(key)
        h = self.encoder(tokens, padding_mask, key=k1, inference=inference)
        return self.head(h, padding_mask, key=k2, inference=inference)


def classification_loss(model, batch, key, inference=False):
    keys = jr.split(key, batch["tokens"].shape[0])
    call = lambda t, m, k: model(t, m, key=k, inference=inference)
    logits = jax.vmap(call)(batch["tokens"], batch["padding_mask"], keys)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
    accuracy = jnp.mean((jnp.argmax(logits, -1) == batch["label"]).astype(jnp.float32))
    return loss, {"accuracy": accuracy}


classifier = Classifier(
    model.encoder, ls.SequenceClassificationHead(64, 4, dropout=0.1, init_std=INIT_STD, key=k_cls)
)
finetuned = ls.train(
    classifier,
    ls.make_optimizer(
        1e-3,
        schedule="linear",
        warmup_steps=FINETUNE_STEPS // 10,
        total_steps=FINETUNE_STEPS,
        b2=0.98,
        eps=1e-6,
        clip_norm=None,
        groups={
            "ssm": ls.ParamGroup(instance_of=ls.S4DKernel, weight_decay=0.0),
            "no_decay": no_decay,
        },
    ),
    classification_loss,
    cls_train,
    steps=FINETUNE_STEPS,
    key=jr.key(2),
    eval_data=cls_valid,
    eval_fn=lambda m, b, k: classification_loss(m, b, k, inference=True),
    log_every=max(1, FINETUNE_STEPS // 10),
    progress=False,
)
cls_eval = [r for r in finetuned.history if r["split"] == "eval"][-1]
print(f"held-out accuracy {cls_eval['accuracy']:.3f} (chance 0.25)")

# %% [markdown]
# ## 5. The routing itself: forward and backward kernels (Figure 3)
#
# `encoder.kernels(L)` returns every layer's two kernels, shape
# `(layers, 2, 1, L)`: `[:, 0]` weighs the input `j` positions before each output,
# `[:, 1]` the input `j` positions after it. As in the paper we show |K| over relative
# positions -10..10, min-max scaled per layer, before and after fine-tuning.

# %%
R = 10


def kernel_rows(encoder, length=LENGTH):
    k = np.abs(np.asarray(encoder.kernels(length)))[:, :, 0, : R + 1]  # (layers, 2, R+1)
    rows = np.full((2 * k.shape[0], 2 * R + 1), np.nan)
    rows[0::2, : R + 1] = k[:, 0, ::-1]  # forward: lag j at relative position -j
    rows[1::2, R:] = k[:, 1]  # backward: lag j at relative position +j
    for i in range(k.shape[0]):
        pair = rows[2 * i : 2 * i + 2]
        rows[2 * i : 2 * i + 2] = (pair - np.nanmin(pair)) / (np.nanmax(pair) - np.nanmin(pair))
    return rows


fig, axes = plt.subplots(1, 2, figsize=(10, 2.6), layout="constrained")
for ax, (title, enc) in zip(
    axes, [("pretrained", model.encoder), ("fine-tuned", finetuned.model.encoder)], strict=True
):
    image = ax.imshow(kernel_rows(enc), aspect="auto", cmap="viridis", vmin=0, vmax=1)
    ax.set_yticks(range(4), ["L0 fwd", "L0 bwd", "L1 fwd", "L1 bwd"])
    ax.set_xticks(range(0, 2 * R + 1, 5), [str(t - R) for t in range(0, 2 * R + 1, 5)])
    ax.set_xlabel("relative position")
    ax.set_title(title)
fig.colorbar(image, ax=axes, label="|K|, min-max per layer")
fig.savefig(OUT / "bigs_kernels.png", dpi=120)

# %% [markdown]
# ## 6. Any length, same weights
#
# Nothing in the model depends on the training length: the kernels are generated for
# the length of the input. This is what lets BiGS continue pretraining at 512 or 4,096
# tokens from a 128-token checkpoint (`bigs pretrain --init-from RUN --length 4096`).

# %%
long_length = 256 if SMALL else 2048
long_text = "".join(train_texts)
tokens = np.concatenate([[tokenizer.cls_id], tokenizer.encode(long_text)])[:long_length]
tokens = jnp.asarray(tokens, dtype=jnp.int32)
hidden = model.encoder(tokens, inference=True)
print(f"encoded {tokens.shape[0]} tokens with a model trained on {LENGTH}: {hidden.shape}")
print(f"done in {time.perf_counter() - start:.0f} s")
