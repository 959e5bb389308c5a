"""Model, data and loss shared by the sharding tests and their multi-process helper."""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

import lineax_seq as ls


@eqx.filter_jit
def make_model():
    return eqx.nn.MLP(4, 2, 8, 2, key=jr.key(0))


@functools.cache  # one optimiser object: train() reuses its compiled step
def optimizer():
    return ls.make_optimizer(1e-2, warmup_steps=1, total_steps=10, weight_decay=0.1)


def batches(n: int = 4, size: int = 8):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, size, 4)).astype(np.float32)
    y = np.stack([np.sin(x).sum(-1), np.cos(x).sum(-1)], -1).astype(np.float32)
    return [(x[i], y[i]) for i in range(n)]


def loss_fn(model, batch, key):
    x, y = batch
    pred = jax.vmap(model)(x)
    return jnp.mean((pred - y) ** 2), {"max_err": jnp.max(jnp.abs(pred - y))}
