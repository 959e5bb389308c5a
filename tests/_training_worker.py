"""A tiny training run, launched as a subprocess by tests/test_training_resume.py.

Usage: python tests/_training_worker.py OUT_DIR [--sleep S] [--kill-in-save STEP]

`--sleep` pauses after every step (so that the parent can SIGKILL the run mid-way);
`--kill-in-save STEP` SIGKILLs the process itself while the checkpoint of STEP is
being written (after its arrays are on disk, before the atomic rename).
"""

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import functools  # noqa: E402
import pathlib  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402

import equinox as eqx  # noqa: E402
import grain  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import jax.random as jr  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import lineax_seq as ls  # noqa: E402
from lineax_seq.training import _checkpoint  # noqa: E402

STEPS = 24
CHECKPOINT_EVERY = 4
BATCH = 8


def dataset():
    """A grain pipeline of (x, y) regression batches, shuffled, repeated."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype(np.float32)
    y = np.sin(x).sum(axis=1, keepdims=True).astype(np.float32)

    def get(i):
        return x[i], y[i]

    ds = grain.MapDataset.range(64).shuffle(seed=3).repeat(None).map(get)
    return ds.batch(BATCH).to_iter_dataset()


def loss_fn(model, batch, key):
    x, y = batch
    x = x + 0.1 * jr.normal(key, x.shape)  # the key matters: resumes must replay it
    pred = jax.vmap(model)(x)
    return jnp.mean((pred - y) ** 2), {"abs_err": jnp.mean(jnp.abs(pred - y))}


@eqx.filter_jit  # one compilation instead of one per initialiser
def make_model():
    return eqx.nn.MLP(3, 1, 16, 2, key=jr.key(0))


@functools.cache
def optimizer():
    return ls.make_optimizer(3e-2, warmup_steps=3, total_steps=STEPS, accumulate_steps=2)


def run(out_dir, *, sleep: float = 0.0, progress: bool = False) -> ls.TrainResult:
    model = make_model()
    return ls.train(
        model,
        optimizer(),
        loss_fn,
        iter(dataset()),
        steps=STEPS,
        key=jr.key(1),
        log_every=1,
        out_dir=out_dir,
        checkpoint_every=CHECKPOINT_EVERY,
        keep_checkpoints=3,
        progress=progress,
        callback=(lambda step, model, record: time.sleep(sleep)) if sleep else None,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--kill-in-save", type=int, default=None)
    args = parser.parse_args()
    if args.kill_in_save is not None:
        fsync_dir = _checkpoint._fsync_dir
        target = f".tmp-step_{args.kill_in_save:08d}"

        def killing_fsync_dir(path):
            fsync_dir(path)
            if pathlib.Path(path).name.startswith(target):
                os.kill(os.getpid(), signal.SIGKILL)

        _checkpoint._fsync_dir = killing_fsync_dir
    run(args.out_dir, sleep=args.sleep)


if __name__ == "__main__":
    main()
