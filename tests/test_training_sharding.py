"""Sharding on the 8 host CPU devices, and a 2-process data-parallel run on loopback."""

import json
import pathlib

import _training_sharding_common as common
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from _devices import needs_8_devices
from _scripts import start_processes, wait_for
from jax.sharding import PartitionSpec as P

import lineax_seq as ls

pytestmark = needs_8_devices

HERE = pathlib.Path(__file__).resolve().parent


def test_make_mesh():
    mesh = ls.make_mesh(4, 2)
    assert dict(mesh.shape) == {"data": 4, "model": 2}
    assert dict(ls.make_mesh().shape) == {"data": len(jax.devices()), "model": 1}
    assert dict(ls.make_mesh(model=4).shape) == {"data": 2, "model": 4}
    with pytest.raises(ValueError, match=r"model=3 must be a positive integer dividing"):
        ls.make_mesh(model=3)
    with pytest.raises(ValueError, match=r"data=5 must be a positive integer"):
        ls.make_mesh(5, 2)


def test_make_mesh_with_data_given_needs_no_divisor():
    """With `data` given, the mesh takes `data * model` of the devices, as `(2, 2)` does;
    `(2, 3)` (6 of 8) was refused because 3 does not divide 8."""
    mesh = ls.make_mesh(2, 3)
    assert dict(mesh.shape) == {"data": 2, "model": 3}
    assert list(mesh.devices.flat) == jax.devices()[:6]
    with pytest.raises(ValueError, match=r"data=3 must be a positive integer with data \* model"):
        ls.make_mesh(3, 3)


def test_shard_batch():
    mesh = ls.make_mesh(8, 1)
    batch = {"x": np.arange(16 * 3.0).reshape(16, 3), "n": np.float32(2.0)}
    out = ls.shard_batch(batch, mesh)
    assert out["x"].sharding.spec == P("data")
    assert {s.data.shape for s in out["x"].addressable_shards} == {(2, 3)}
    assert len({s.device for s in out["x"].addressable_shards}) == 8
    np.testing.assert_array_equal(np.asarray(out["x"]), batch["x"])
    assert out["n"].sharding.is_fully_replicated
    with pytest.raises(ValueError, match=r"batch leaf \['x'\] has leading \(batch\) size 12"):
        ls.shard_batch({"x": np.zeros((12, 3))}, mesh)
    with pytest.raises(ValueError, match=r"axis='batch' is not an axis of the mesh"):
        ls.shard_batch(batch, mesh, axis="batch")


def test_mesh_and_batch_argument_types():
    assert dict(ls.make_mesh(np.int64(4), np.int64(2)).shape) == {"data": 4, "model": 2}
    for kw, name in (({"data": True}, "data"), ({"model": True}, "model")):
        with pytest.raises(ValueError, match=f"{name} must be a positive integer, got {name}="):
            ls.make_mesh(**kw)
    mesh = ls.make_mesh(8, 1)
    batch = {"x": np.zeros((8, 2), np.float32), "meta": {"name": "abc"}}
    with pytest.raises(
        TypeError, match=r"batch leaf \['meta'\]\['name'\] must be a numeric .*'abc'"
    ):
        ls.shard_batch(batch, mesh)


def test_devices_and_mesh_arguments_named(no_jaxtyping):
    """A `devices` that is not a sequence of distinct devices, or a `mesh` that is not a
    `Mesh`, is an error naming it (they failed by a missing attribute, or, for a device
    given twice, not at all)."""
    cpu = jax.devices()[0]
    for devices, got in (("cpu", "devices='cpu'"), ([cpu, "cpu"], r"devices\[1\]='cpu'"),
                         (3, "devices=3"), (cpu, "devices=CpuDevice")):  # fmt: skip
        with pytest.raises(TypeError, match=f"devices must be a sequence of jax.Device.*{got}"):
            ls.make_mesh(devices=devices)
    with pytest.raises(ValueError, match=r"devices must hold at least one device"):
        ls.make_mesh(devices=[])
    with pytest.raises(ValueError, match=r"devices must be distinct, got CpuDevice\(id=0\) twice"):
        ls.make_mesh(devices=[cpu, cpu])
    assert dict(ls.make_mesh(devices=tuple(jax.devices()[:2])).shape) == {"data": 2, "model": 1}
    model = eqx.nn.Linear(2, 2, key=jr.key(0))
    calls = (
        lambda mesh: ls.shard_batch({"x": np.zeros((8, 2))}, mesh),
        lambda mesh: ls.param_sharding(model, mesh),
        lambda mesh: ls.shard_params(model, mesh),
    )
    for call in calls:
        for mesh in (None, "data"):
            with pytest.raises(TypeError, match=f"mesh must be a jax.sharding.Mesh.*mesh={mesh!r}"):
                call(mesh)
    # jax.make_mesh's default axes are Explicit: refused up front (a train step failed
    # inside jit, "with_sharding_constraint can only refer to Auto axes").
    explicit = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    for call in calls + (
        lambda mesh: ls.make_train_step(common.loss_fn, common.optimizer(), mesh=mesh),
    ):
        with pytest.raises(ValueError, match=r"mesh has Explicit axes \['data'\] .*make_mesh"):
            call(explicit)


def test_param_sharding_rule():
    mesh = ls.make_mesh(4, 2)
    tree = {"w": jnp.zeros((8, 6)), "odd": jnp.zeros((3, 5)), "b": jnp.zeros(8), "i": 3}
    tree |= {"stacked": jnp.zeros((4, 3, 5)), "heads": jnp.zeros((4, 4, 3))}
    specs = ls.param_sharding(tree, mesh, min_shard_size=1)
    assert specs["w"].spec == P(None, "model")  # last divisible dimension
    assert specs["odd"].spec == P()  # nothing divisible: replicated
    # Never the leading axis of 3 or more (stacked layers: it was ("model", None, None)).
    assert specs["stacked"].spec == P() and specs["heads"].spec == P(None, "model", None)
    assert specs["b"].spec == P()  # vectors replicated
    assert specs["i"] is None
    assert ls.param_sharding(tree, mesh)["w"].spec == P()  # below default min_shard_size
    placed = ls.shard_params(tree, mesh, min_shard_size=1)
    assert {s.data.shape for s in placed["w"].addressable_shards} == {(8, 3)}


def test_sharded_step_equals_single_device():
    """Data parallel over 4 devices x tensor parallel over 2 == one device."""
    batch = common.batches(1, 8)[0]
    key = jr.key(1)
    opt = common.optimizer()

    def run(mesh):
        model = common.make_model()
        opt_state = opt.init(eqx.filter(model, eqx.is_inexact_array))
        b = batch
        if mesh is not None:
            model = ls.shard_params(model, mesh, min_shard_size=1)
            opt_state = ls.shard_params(opt_state, mesh, min_shard_size=1)
            b = ls.shard_batch(batch, mesh)
        step = ls.make_train_step(common.loss_fn, opt, mesh=mesh, min_shard_size=1)
        for _ in range(2):
            model, opt_state, metrics = step(model, opt_state, b, key)
        return model, opt_state, metrics

    mesh = ls.make_mesh(4, 2)
    model_1, _, metrics_1 = run(None)
    model_8, opt_8, metrics_8 = run(mesh)
    np.testing.assert_allclose(metrics_8["loss"], metrics_1["loss"], rtol=1e-5)
    for a, b in zip(
        jax.tree.leaves(eqx.filter(model_8, eqx.is_array)),
        jax.tree.leaves(eqx.filter(model_1, eqx.is_array)),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # The step kept the layout asked for: weights split over "model", batch over "data".
    assert model_8.layers[1].weight.sharding.spec == P(None, "model")
    assert model_8.layers[1].bias.sharding.is_fully_replicated
    adam_mu = [x for x in jax.tree.leaves(opt_8) if getattr(x, "shape", None) == (8, 8)]
    assert adam_mu and all(x.sharding.spec == P(None, "model") for x in adam_mu)
    assert len(model_8.layers[1].weight.addressable_shards) == 8


def test_eval_batch_that_does_not_divide_the_mesh_is_replicated():
    """A finite eval set's shorter last batch (3 examples on 8 "data" devices) is
    evaluated, not a ValueError at the first evaluation (which lost the final checkpoint)."""
    (x, y), *_ = common.batches(1, 8)
    train = [(x, y)]
    evals = [(x, y), (x[:3], y[:3])]
    records = {}
    for name, mesh in (("one", None), ("mesh", ls.make_mesh(8, 1))):
        args = (common.make_model(), common.optimizer(), common.loss_fn, train)
        result = ls.train(*args, steps=1, key=jr.key(0), eval_data=evals, mesh=mesh, progress=False)
        (records[name],) = [r for r in result.history if r["split"] == "eval"]
    assert records["mesh"].keys() == records["one"].keys()
    for k in ("loss", "max_err"):
        np.testing.assert_allclose(records["mesh"][k], records["one"][k], rtol=1e-5)


@pytest.mark.slow
def test_two_processes_data_parallel_equals_single_process(tmp_path):
    # Two hosts on loopback (2 CPU devices each: the script sets XLA_FLAGS).
    procs = start_processes(HERE / "_training_multihost.py", 2, str(tmp_path / "multi"), cwd=HERE)
    # Meanwhile: the same run in this process, on one device, without a mesh.
    batches = common.batches()
    single = ls.train(
        common.make_model(),
        common.optimizer(),
        common.loss_fn,
        batches,
        steps=len(batches),
        key=jr.key(0),
        log_every=1,
        progress=False,
    )
    wait_for(procs)
    multi = [
        json.loads(line) for line in (tmp_path / "multi/metrics.jsonl").read_text().splitlines()
    ]
    np.testing.assert_allclose(
        [r["loss"] for r in multi], [r["loss"] for r in single.history], rtol=1e-5
    )
    assert multi[-1]["samples_per_s"] > 0
    final = np.load(tmp_path / "multi/final.npz")
    expected = jax.tree.leaves(eqx.filter(single.model, eqx.is_array))
    assert len(final.files) == len(expected)
    for i, b in enumerate(expected):
        np.testing.assert_allclose(final[f"arr_{i}"], np.asarray(b), rtol=1e-5, atol=1e-6)
    # Resumed in both processes from the last checkpoint, loaded onto the mesh.
    resumed = np.load(tmp_path / "multi/resumed.npz")
    for name in final.files:
        np.testing.assert_array_equal(resumed[name], final[name])
    # Process 0 wrote the checkpoints (gathered from both processes); they load.
    ckpt = ls.load_checkpoint(
        tmp_path / "multi/checkpoints",
        model=common.make_model(),
        opt_state=common.optimizer().init(eqx.filter(common.make_model(), eqx.is_inexact_array)),
    )
    assert ckpt.step == len(batches)


def test_checkpoint_loads_onto_the_templates_shardings(tmp_path):
    """A checkpoint loaded into a sharded template (or abstract one with shardings) is
    placed as the template is, never gathered on one device first."""
    mesh = ls.make_mesh(4, 2)
    model, opt = common.make_model(), common.optimizer()
    model = eqx.tree_at(
        lambda m: m.layers[1].weight, model, replace_fn=lambda w: w.astype("bfloat16")
    )
    state = opt.init(eqx.filter(model, eqx.is_inexact_array))
    path = ls.save_checkpoint(tmp_path, 1, model=model, opt_state=state)
    sharded = ls.shard_params(model, mesh, min_shard_size=1)
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
        ls.shard_params(state, mesh, min_shard_size=1),
    )
    ckpt = ls.load_checkpoint(path, model=sharded, opt_state=abstract)
    arrays = lambda tree: jax.tree.leaves(eqx.filter(tree, eqx.is_array))
    for got, like in zip(arrays(ckpt.model), arrays(sharded), strict=True):
        assert got.sharding == like.sharding
    assert ckpt.model.layers[1].weight.sharding.spec == P(None, "model")
    placed = jax.tree.leaves(ckpt.opt_state)
    assert [x.sharding for x in placed] == [x.sharding for x in jax.tree.leaves(abstract)]
    for got, want in zip(arrays(ckpt.model), arrays(model), strict=True):
        np.testing.assert_array_equal(got, want)
    assert ckpt.model.layers[1].weight.dtype == jnp.bfloat16  # NumPy reads it as raw bytes
    # A one-device template's arrays are not committed to its device.
    default = ls.load_checkpoint(path, model=model).model.layers[1].weight
    assert default.sharding.device_set == {jax.devices()[0]} and not default.committed
