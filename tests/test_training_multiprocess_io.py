"""`train` and `save_checkpoint` across processes that reach them at different times.

Run as a script (`python tests/test_training_multiprocess_io.py PROCESS_ID 2 PORT OUT_DIR`)
this file is one JAX process of a 2-process run: `train(resume=False)`, then
`save_checkpoint` and `load_checkpoint`.
"""

import json
import pathlib
import sys
import time

import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from _scripts import join_processes, start_processes, wait_for

HERE = pathlib.Path(__file__).resolve().parent


def _loss(w, b, key):
    return jnp.mean((b @ w) ** 2), None


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """The outcomes of `_process_main` in a 2-process run (this file as a script)."""
    out = tmp_path_factory.mktemp("two_processes")
    wait_for(start_processes(pathlib.Path(__file__), 2, str(out), cwd=HERE.parent), timeout=120)
    return out


@pytest.mark.slow
def test_processes_that_start_late_see_a_new_out_dir(two_processes):
    """`train(resume=False)` in a 2-process run whose process 1 reaches `train` later:
    process 1 found the metrics file process 0 had just opened and refused the new
    `out_dir` as one that "already holds a run"."""
    for i in range(2):
        assert (two_processes / f"train{i}.txt").read_text() == "ok"
    records = (two_processes / "run/metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in records] == [1, 2]


@pytest.mark.slow
def test_every_process_can_load_the_checkpoint_it_saved(two_processes):
    """`save_checkpoint` returned at once on processes other than 0, so loading the path
    it returned failed there while process 0 was still writing ("does not exist")."""
    for i in range(2):
        assert (two_processes / f"load{i}.txt").read_text() == "ok"


def _outcome(path: pathlib.Path, fn) -> None:
    try:
        fn()
    except Exception as e:
        path.write_text(repr(e))
    else:
        path.write_text("ok")


def _process_main() -> None:
    import jax

    process_id, _, out = join_processes()
    import lineax_seq as ls
    from lineax_seq.training import _checkpoint

    jnp.ones(3).block_until_ready()  # both processes' backends are up
    if process_id == 1:
        time.sleep(2)  # e.g. a slower data pipeline
    kw = dict(steps=2, key=jr.key(0), log_every=1, out_dir=out / "run", progress=False)
    data = [np.ones((2, 3), np.float32)] * 2
    train = lambda: ls.train(jnp.ones(3), ls.make_optimizer(1e-2), _loss, data, **kw, resume=False)
    _outcome(out / f"train{process_id}.txt", train)

    if process_id == 0:  # a slow disk
        fsync = _checkpoint._fsync
        _checkpoint._fsync = lambda f: (time.sleep(1), fsync(f))

    def save_and_load():
        path = ls.save_checkpoint(out / "ckpt", 1, model=jnp.ones(3))
        assert ls.load_checkpoint(path, model=jnp.zeros(3)).step == 1

    _outcome(out / f"load{process_id}.txt", save_and_load)
    jax.distributed.shutdown()


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    _process_main()
