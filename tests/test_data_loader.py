"""The loader across processes: grain worker processes, and sharding over JAX processes.

Run as a script (`python tests/test_data_loader.py PROCESS_ID NUM_PROCESSES PORT OUT`)
this file is one JAX process of a multi-process run: it joins the others with
`jax.distributed.initialize` and writes the example ids that its default-sharded
pipeline yields.
"""

import json
import pathlib
import sys

import numpy as np
from _scripts import join_processes, start_processes, wait_for

HERE = pathlib.Path(__file__).resolve().parent
NUM_EXAMPLES = 25
DOCS = [f"document {i}: " + "abc " * (i % 7 + 3) for i in range(12)]


def _id_pipeline(**kwargs):
    import grain

    import lineax_seq as ls

    ids = grain.MapDataset.range(NUM_EXAMPLES).map(lambda i: {"id": np.int64(i)})
    return ls.batch_examples(ids, batch_size=2, num_epochs=1, seed=3, **kwargs)


def _assert_batches_equal(xs, ys):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def test_worker_processes_give_the_same_batches_and_resume():
    import lineax_seq as ls

    tok = ls.ByteTokenizer()
    kwargs = dict(length=12, batch_size=4, seed=1, masking="dynamic")
    expected = [b for b, _ in zip(ls.mlm_dataset(DOCS, tok, **kwargs), range(8), strict=False)]
    it = iter(ls.mlm_dataset(DOCS, tok, num_workers=2, **kwargs))
    got = [next(it) for _ in range(4)]
    state = json.loads(json.dumps(it.get_state()))
    got += [next(it) for _ in range(4)]
    _assert_batches_equal(got, expected)  # workers change nothing but speed
    resumed = iter(ls.mlm_dataset(DOCS, tok, num_workers=2, **kwargs))
    resumed.set_state(state)
    _assert_batches_equal([next(resumed) for _ in range(4)], expected[4:])


def test_default_sharding_splits_examples_over_jax_processes(tmp_path):
    # Two processes on loopback, as two hosts.
    wait_for(start_processes(pathlib.Path(__file__), 2, str(tmp_path), cwd=HERE.parent))
    seen = [json.loads((tmp_path / f"ids{i}.json").read_text()) for i in range(2)]
    # ShardByJaxProcess(drop_remainder=True): process i keeps examples i, i+2, ... of
    # the first 24 (so both take the same number of steps), shuffled; none twice.
    assert sorted(seen[0]) == list(range(0, 24, 2))
    assert sorted(seen[1]) == list(range(1, 24, 2))
    assert seen[0] != sorted(seen[0])  # shuffled within the shard
    # In this (single) process the same pipeline sees every example (12 batches of 2).
    assert len({int(i) for b in _id_pipeline() for i in b["id"]}) == NUM_EXAMPLES - 1


def _process_main() -> None:
    import jax

    process_id, num_processes, out = join_processes()
    assert jax.process_count() == num_processes
    ids = [int(i) for b in _id_pipeline() for i in b["id"]]
    (out / f"ids{process_id}.json").write_text(json.dumps(ids))
    jax.distributed.shutdown()


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    _process_main()
