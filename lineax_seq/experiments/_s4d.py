"""S4D on a long-memory task: recall a token across 750-1,000+ blank steps.

Each sequence holds one *key* token (one of `num_classes`) at a random position in
its first quarter; every other token is blank (embedded as zero). At the last step
the model must output the key. Nothing but the S4D layer carries information along
the sequence, so it must remember across `0.75 * length` to `length - 1` steps: its
kernels must not have decayed after that many lags, and must point the same way over
the whole range of lags. The trivial baseline (always the majority class) is right
about `1 / num_classes` of the time.

`demo(out_dir, small=...)` is what `python -m lineax_seq demo` runs (its `s4d` section);
there is no `s4d` command: `train_memory_task` takes the other settings (`length`,
`steps`, `batch`, `num_classes`, `dim`, `state_size`, `learning_rate`, `seed`).
"""

import json
import pathlib
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import optax
from jaxtyping import Array, Float, Int, PRNGKeyArray
from tqdm.auto import tqdm

from ..ssm import S4D, S4DKernel
from ..training import ParamGroup, make_optimizer, make_train_step


def make_batch(
    key: PRNGKeyArray, batch: int, length: int, num_classes: int
) -> tuple[Int[Array, "batch length"], Int[Array, " batch"]]:
    """Token ids `(batch, length)` and target classes `(batch,)` of the recall task.

    Ids `0..num_classes-1` are keys, `num_classes` is the blank that fills the rest. The
    key sits at a random position in the first quarter of the sequence.
    """
    t_key, p_key = jr.split(key)
    target = jr.randint(t_key, (batch,), 0, num_classes)
    position = jr.randint(p_key, (batch,), 0, max(length // 4, 1))
    at_key = jnp.arange(length) == position[:, None]
    return jnp.where(at_key, target[:, None], num_classes), target


class MemoryModel(eqx.Module):
    """Token embedding (blank = 0) -> S4D -> LayerNorm -> MLP readout at the last step.

    The S4D layer is linear, so at the last step it outputs exactly
    `K[:, length - 1] * embedding(key)`: what survives of the key after `length - 1`
    lags. The normalisation rescales it, and the MLP reads the class out of it.
    """

    embedding: eqx.nn.Embedding
    ssm: S4D
    norm: eqx.nn.LayerNorm
    readout: eqx.nn.MLP
    num_classes: int = eqx.field(static=True)

    def __init__(self, num_classes: int, dim: int, state_size: int, *, key: PRNGKeyArray):
        e_key, s_key, r_key = jr.split(key, 3)
        self.embedding = eqx.nn.Embedding(num_classes + 1, dim, key=e_key)
        self.ssm = S4D(dim, state_size=state_size, dt_min=1e-4, dt_max=1e-1, key=s_key)
        self.norm = eqx.nn.LayerNorm(dim, eps=1e-10)
        self.readout = eqx.nn.MLP(dim, num_classes, 4 * dim, 1, activation=jax.nn.gelu, key=r_key)
        self.num_classes = num_classes

    def __call__(self, tokens: Int[Array, " length"]) -> Float[Array, " classes"]:
        blank = (tokens == self.num_classes)[:, None]
        x = jnp.where(blank, 0.0, jax.vmap(self.embedding)(tokens))
        return self.readout(self.norm(self.ssm(x)[-1]))


def _loss(model: MemoryModel, batch, key):
    del key
    tokens, target = batch
    logits = jax.vmap(model)(tokens)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, target).mean()
    return loss, {"accuracy": jnp.mean(jnp.argmax(logits, -1) == target)}


def _plot_kernels(before: np.ndarray, after: np.ndarray, path: pathlib.Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5))
    axes = fig.subplots(2, 1, sharex=True)
    lags = np.arange(before.shape[-1])
    for ax, kernels, title in ((axes[0], before, "at initialisation"), (axes[1], after, "learned")):
        for k in kernels:
            ax.plot(lags, k, lw=0.8)
        ax.set_title(f"S4D kernels of the 4 channels reaching furthest ({title})")
        ax.set_ylabel("K[lag]")
    axes[1].set_xlabel("lag")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def train_memory_task(
    *,
    length: int,
    steps: int,
    batch: int = 32,
    num_classes: int = 8,
    dim: int = 32,
    state_size: int = 32,
    learning_rate: float = 3e-3,
    seed: int = 0,
    out_dir: pathlib.Path | None = None,
    progress: bool = True,
) -> dict:
    """Train a small S4D model on the recall task; return accuracy and baseline."""
    key = jr.key(seed)
    model_key, data_key, eval_key = jr.split(key, 3)
    model = MemoryModel(num_classes, dim, state_size, key=model_key)
    kernel_at = eqx.filter_jit(lambda kernel, n: kernel(n))  # one compile, not op by op
    kernels_before = np.asarray(kernel_at(model.ssm.kernel, length))
    optimizer = make_optimizer(
        learning_rate,
        warmup_steps=max(steps // 10, 1),
        total_steps=steps,
        weight_decay=0.01,
        groups={"ssm": ParamGroup(instance_of=S4DKernel, weight_decay=0.0)},
    )
    opt_state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
    step = make_train_step(_loss, optimizer)
    start = time.perf_counter()
    bar = tqdm(range(steps), desc=f"S4D recall, L={length}", disable=not progress)
    for i in bar:
        data = make_batch(jr.fold_in(data_key, i), batch, length, num_classes)
        model, opt_state, metrics = step(model, opt_state, data, jr.fold_in(key, i))
        if i % 10 == 0 or i == steps - 1:
            bar.set_postfix(
                loss=f"{float(metrics['loss']):.3f}", acc=f"{float(metrics['accuracy']):.2f}"
            )
    train_seconds = time.perf_counter() - start
    evaluate = eqx.filter_jit(lambda m, d: _loss(m, d, None)[1]["accuracy"])
    tokens, target = make_batch(eval_key, 512, length, num_classes)
    accuracy = float(evaluate(model, (tokens, target)))
    # The kernel is evaluated at any length: the same model, 4x longer sequences.
    long_accuracy = float(evaluate(model, make_batch(eval_key, 512, 4 * length, num_classes)))
    majority = float(jnp.max(jnp.bincount(target, length=num_classes)) / target.shape[0])
    result = {
        "length": length,
        "steps": steps,
        "accuracy": accuracy,
        "accuracy_at_4x_length": long_accuracy,
        "majority_baseline": majority,
        "chance": 1 / num_classes,
        "train_seconds": train_seconds,
    }
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        kernels_after = np.asarray(kernel_at(model.ssm.kernel, length))
        # Show the channels whose learned kernels reach furthest (largest tail energy).
        tail = np.abs(kernels_after[:, length // 2 :]).sum(-1)
        chosen = np.argsort(tail)[-4:]
        _plot_kernels(kernels_before[chosen], kernels_after[chosen], out_dir / "s4d_kernels.png")
        (out_dir / "s4d_metrics.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def demo(out_dir: pathlib.Path, *, small: bool) -> None:
    """Train S4D on recall over 1,024 steps; print accuracy vs majority; plot kernels."""
    steps = 60 if small else 120
    # A progress bar on a terminal only: in a log it is one line of carriage returns.
    result = train_memory_task(
        length=1024, steps=steps, out_dir=out_dir, progress=sys.stderr.isatty()
    )
    print(
        f"S4D recall across {3 * result['length'] // 4}-{result['length'] - 1} blank steps: "
        f"accuracy "
        f"{result['accuracy']:.1%} vs majority baseline {result['majority_baseline']:.1%} "
        f"(chance {result['chance']:.1%}); at 4x the training length "
        f"{result['accuracy_at_4x_length']:.1%}. Trained {result['steps']} steps in "
        f"{result['train_seconds']:.0f} s; kernels: {out_dir / 's4d_kernels.png'}"
    )
