"""One process of a 2-process data-parallel run (launched by tests/test_training_sharding.py).

Usage: python tests/_training_multihost.py PROCESS_ID NUM_PROCESSES PORT OUT_DIR

Each process has 2 CPU devices; `jax.distributed.initialize` joins them into one
4-device mesh (CPU collectives: gloo, JAX's default `jax_cpu_collectives_implementation`).
Every process feeds its own half of each global batch, exactly as a grain pipeline
sharded with `ShardByJaxProcess` would.
"""

import os
import sys

from _scripts import xla_flags

os.environ["XLA_FLAGS"] = xla_flags(2)

import pathlib  # noqa: E402

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def main() -> None:
    from _scripts import join_processes

    process_id, num_processes, out_dir = join_processes()
    import _training_sharding_common as common

    import lineax_seq as ls

    assert jax.process_count() == num_processes and jax.device_count() == 2 * num_processes
    mesh = ls.make_mesh()  # ("data", "model") = (4, 1) over both processes
    batches = common.batches()
    local = len(batches[0][0]) // num_processes
    sl = slice(process_id * local, (process_id + 1) * local)
    data = [(x[sl], y[sl]) for x, y in batches]
    run = lambda **options: ls.train(
        common.make_model(),
        common.optimizer(),
        common.loss_fn,
        data,
        steps=len(batches),
        key=jax.random.key(0),
        out_dir=out_dir,
        mesh=mesh,
        progress=False,
        **options,
    )
    result = run(log_every=1, checkpoint_every=2)
    # Resumed from its last checkpoint, read straight onto the mesh by both processes:
    # nothing left to train, the same model.
    resumed = run(resume=True)
    assert resumed.resumed_from == len(batches), resumed.resumed_from
    placed = resumed.model.layers[0].weight.sharding
    assert placed.mesh == mesh and len(placed.device_set) == jax.device_count()
    if process_id == 0:
        for name, model in (("final", result.model), ("resumed", resumed.model)):
            arrays = jax.tree.leaves(eqx.filter(model, eqx.is_array))
            leaves = [np.asarray(x.addressable_data(0)) for x in arrays]
            np.savez(out_dir / f"{name}.npz", *leaves)
    # A "data" shard on both processes' devices would need the same batch from both:
    # each passing its own slice made a wrong global batch, silently.
    # So would a mesh on one process's devices only.
    for mesh, message in (
        (ls.make_mesh(1, 4), "spans processes [0, 1]"),
        (ls.make_mesh(2, 1), "fall [2, 0] on the processes"),
    ):
        try:
            ls.shard_batch(np.zeros(4, np.float32), mesh)
        except ValueError as error:
            assert message in str(error), error
        else:
            raise AssertionError(f"shard_batch accepted a bad mesh {mesh.shape}")
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
