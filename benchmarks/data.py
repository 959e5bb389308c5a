"""Data-pipeline throughput vs. the train step's consumption rate.

Times the causal-LM and masked-LM grain pipelines of `lineax_seq` (stdlib corpus, byte
tokenizer) under several grain reader settings (in-thread, reader threads, worker
processes via `mp_prefetch`), in tokens per second, next to the tokens per second that
a train step of a mid-size S4D language model (embedding, pre-norm residual S4D + MLP
blocks, tied output head; AdamW via optax) consumes at the same batch shape. The ratio
pipeline / train step says how far the pipeline is from being the bottleneck.

    python benchmarks/data.py            # full
    python benchmarks/data.py --quick    # smoke run (small model, few batches; data_quick.json)
    python benchmarks/data.py --plot-only benchmarks/results/data.json   # redraw its PNG
"""

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jax.random as jr  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from _common import (  # noqa: E402
    RESULTS,
    add_plot_only,
    median_time,
    plot_from_json,
    recorded_device,
    save,
)

import lineax_seq as ls  # noqa: E402


class Block(eqx.Module):
    norm1: eqx.nn.LayerNorm
    ssm: ls.S4D
    norm2: eqx.nn.LayerNorm
    mlp: eqx.nn.MLP

    def __init__(self, dim, *, bidirectional, key):
        k1, k2 = jr.split(key)
        self.norm1 = eqx.nn.LayerNorm(dim)
        self.ssm = ls.S4D(dim, state_size=64, bidirectional=bidirectional, key=k1)
        self.norm2 = eqx.nn.LayerNorm(dim)
        self.mlp = eqx.nn.MLP(dim, dim, 4 * dim, depth=1, activation=jax.nn.gelu, key=k2)

    def __call__(self, x):
        x = x + self.ssm(jax.vmap(self.norm1)(x))
        return x + jax.vmap(self.mlp)(jax.vmap(self.norm2)(x))


class SSMLanguageModel(eqx.Module):
    embedding: eqx.nn.Embedding
    blocks: list[Block]
    norm: eqx.nn.LayerNorm

    def __init__(self, vocab_size, dim, num_layers, *, bidirectional, key):
        keys = jr.split(key, num_layers + 1)
        self.embedding = eqx.nn.Embedding(vocab_size, dim, key=keys[0])
        self.blocks = [Block(dim, bidirectional=bidirectional, key=k) for k in keys[1:]]
        self.norm = eqx.nn.LayerNorm(dim)

    def __call__(self, tokens):
        x = jax.vmap(self.embedding)(tokens)
        for block in self.blocks:
            x = block(x)
        return jax.vmap(self.norm)(x) @ self.embedding.weight.T


def make_step(model, optimizer, input_key, target_key):
    def loss_fn(model, batch):
        logits = jax.vmap(model)(batch[input_key])
        targets = batch[target_key]
        valid = targets != ls.IGNORE_INDEX
        losses = optax.softmax_cross_entropy_with_integer_labels(
            logits, jnp.where(valid, targets, 0)
        )
        return jnp.sum(jnp.where(valid, losses, 0.0)) / jnp.maximum(jnp.sum(valid), 1)

    @eqx.filter_jit(donate="all-except-first")
    def step(batch, model, opt_state):
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, batch)
        updates, opt_state = optimizer.update(
            grads, opt_state, eqx.filter(model, eqx.is_inexact_array)
        )
        return eqx.apply_updates(model, updates), opt_state, loss

    return step


def train_rate(batch, *, vocab, dim, layers, bidirectional, input_key, target_key, repeats):
    model = SSMLanguageModel(vocab, dim, layers, bidirectional=bidirectional, key=jr.key(0))
    optimizer = optax.adamw(1e-3, weight_decay=0.01)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_inexact_array))
    step = make_step(model, optimizer, input_key, target_key)
    batch = jax.device_put({k: jnp.asarray(v) for k, v in batch.items()})
    state = [model, opt_state]

    def run():
        state[0], state[1], loss = step(batch, state[0], state[1])
        return loss

    seconds = median_time(run, repeats=repeats, warmup=2)
    params = ls.count_parameters(model)
    tokens = int(np.prod(batch[input_key].shape))
    return {"step_seconds": seconds, "tokens_per_s": tokens / seconds, "parameters": params}


def pipeline_rate(make, num_batches):
    """Tokens/s of iterating a fresh pipeline (timed after its first batch)."""
    start = time.perf_counter()
    ds = make()
    it = iter(ds)
    first = next(it)
    ready = time.perf_counter()
    for _ in range(num_batches):
        batch = next(it)
    elapsed = time.perf_counter() - ready
    if hasattr(it, "close"):
        it.close()
    tokens = int(np.prod(next(iter(first.values())).shape)) * num_batches
    del batch
    return {
        "tokens_per_s": tokens / elapsed,
        "batches_per_s": num_batches / elapsed,
        "startup_seconds": ready - start,
    }, first


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fast smoke run")
    add_plot_only(parser)
    args = parser.parse_args()
    if args.plot_only:
        plot_from_json(plot, args.plot_only)
        return
    quick = args.quick

    length, batch_size = (256, 4) if quick else (1024, 8)
    dim, layers = (64, 2) if quick else (256, 4)
    num_batches = 20 if quick else 200
    repeats = 3 if quick else 5
    settings = {
        "in-thread": dict(num_threads=0, num_workers=0),
        "2 reader threads": dict(num_threads=2, num_workers=0),
    }
    if not quick:
        settings["2 worker processes"] = dict(num_threads=0, num_workers=2)

    tok = ls.ByteTokenizer()
    texts = ls.text_corpus(split="train")
    print(f"corpus: {len(texts)} stdlib documents; L={length}, batch={batch_size}")

    results = {"lm": {}, "mlm": {}}
    batches = {}
    for name, kw in settings.items():
        results["lm"][name], batches["lm"] = pipeline_rate(
            lambda kw=kw: ls.lm_dataset(texts, tok, length=length, batch_size=batch_size, **kw),
            num_batches,
        )
        results["mlm"][name], batches["mlm"] = pipeline_rate(
            lambda kw=kw: ls.mlm_dataset(texts, tok, length=length, batch_size=batch_size, **kw),
            num_batches,
        )
        for task in ("lm", "mlm"):
            r = results[task][name]
            print(
                f"{task:>3} pipeline [{name}]: {r['tokens_per_s']:>12,.0f} tokens/s "
                f"(startup {r['startup_seconds']:.2f} s)"
            )

    model_cfg = dict(vocab=tok.vocab_size, dim=dim, layers=layers, repeats=repeats)
    train = {
        "lm": train_rate(
            batches["lm"],
            bidirectional=False,
            input_key="inputs",
            target_key="targets",
            **model_cfg,
        ),
        "mlm": train_rate(
            batches["mlm"],
            bidirectional=True,
            input_key="tokens",
            target_key="labels",
            **model_cfg,
        ),
    }
    summary = {}
    for task in ("lm", "mlm"):
        t = train[task]
        slowest = min(r["tokens_per_s"] for r in results[task].values())
        summary[task] = {
            "train_tokens_per_s": t["tokens_per_s"],
            "slowest_pipeline_tokens_per_s": slowest,
            "headroom": slowest / t["tokens_per_s"],
        }
        print(
            f"{task:>3} train step ({t['parameters'] / 1e6:.2f}M params): "
            f"{t['tokens_per_s']:>12,.0f} tokens/s ({t['step_seconds'] * 1e3:.1f} ms/step); "
            f"slowest pipeline is {slowest / t['tokens_per_s']:.1f}x faster"
        )

    payload = {
        "config": {
            "quick": quick,
            "length": length,
            "batch_size": batch_size,
            "model": {"dim": dim, "layers": layers, "state_size": 64, "vocab": tok.vocab_size},
            "num_batches": num_batches,
            "settings": settings,
            "tokenizer": "byte",
        },
        "pipeline": results,
        "train_step": train,
        "summary": summary,
    }
    path = save(
        "data_quick" if quick else "data", payload, args=args, parser=parser
    )  # quick runs keep the full
    print(f"wrote {path}")
    plot_from_json(plot, path)


def plot(payload, path):
    """Pipeline rates against the train step's, from a results JSON."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.8))
    axes = fig.subplots(1, 2, sharey=True)
    for ax, task, title in zip(axes, ("lm", "mlm"), ("causal LM", "masked LM"), strict=True):
        names = list(payload["pipeline"][task])
        rates = [payload["pipeline"][task][n]["tokens_per_s"] for n in names]
        ax.barh(names, rates, color="tab:blue", label="pipeline")
        consume = payload["train_step"][task]["tokens_per_s"]
        ax.axvline(consume, color="tab:red", ls="--", label="train step consumes")
        ax.set_xscale("log")
        ax.set_xlabel("tokens / s")
        ax.set_title(f"{title} (L={payload['config']['length']})")
        ax.legend(loc="lower right", fontsize=8)
    m = payload["config"]["model"]
    fig.suptitle(
        f"grain pipeline vs S4D LM train step (dim {m['dim']}, {m['layers']} layers, "
        f"{recorded_device(payload)[1]})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    RESULTS.mkdir(parents=True, exist_ok=True)
    main()
