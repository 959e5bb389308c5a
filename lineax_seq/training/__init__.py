"""`lineax_seq.training`: optimisers, the train loop, checkpoints and sharding.

Models are plain Equinox PyTrees here; only their inexact arrays are trained.

Optimisers (optax):

```python
make_schedule(peak_lr, *, schedule=None|"cosine"|"linear"|"constant", warmup_steps=0,
              total_steps=None, init_lr=0.0, end_lr=0.0) -> optax.Schedule
# schedule=None: "cosine" with total_steps, else "constant" (after the warmup)
ParamGroup(match: str | (path: str, leaf) -> bool = None,    # regex on keystr path
           where: (model) -> node(s) = None,                  # eqx.tree_at-style
           instance_of: type | tuple[type, ...] = None,       # e.g. ls.S4DKernel
           learning_rate: float | None = None, weight_decay: float | None = None)
param_labels(model, groups: dict[str, ParamGroup]) -> PyTree[str]   # "default" if none
make_optimizer(learning_rate=1e-3, *, schedule=None, warmup_steps=0,
               total_steps=None, end_lr_ratio=0.0, weight_decay=0.01, b1=0.9, b2=0.999,
               eps=1e-8, clip_norm=1.0, accumulate_steps=1,
               groups: dict[str, ParamGroup] | None = None) -> optax.GradientTransformation
# it carries .learning_rate_schedule ("default" group's) and .accumulate_steps: train logs "lr"
opt_state = opt.init(eqx.filter(model, eqx.is_inexact_array))
```

Train loop (`loss_fn(model, batch, key) -> (scalar loss, dict of scalar metrics | None)`,
the batch is the whole batch: vmap inside `loss_fn`):

```python
step = make_train_step(loss_fn, optimizer, *, mesh=None, min_shard_size=2**16, donate=True)
model, opt_state, metrics = step(model, opt_state, batch, key)   # metrics: loss, grad_norm, aux
eval_step = make_eval_step(loss_fn); metrics = eval_step(model, batch, key)
result = train(model, optimizer, loss_fn, data, *, steps, key, opt_state=None,
               eval_data=None, eval_fn=None, eval_every=0, eval_batches=None,
               log_every=10, out_dir=None, checkpoint_every=0, keep_checkpoints=3,
               resume=True, unit="samples"|"tokens", mesh=None, min_shard_size=2**16,
               progress=True, plot=False, callback=None) -> TrainResult
# TrainResult(model, opt_state, step, key, history: list[dict], resumed_from)
# out_dir/metrics.jsonl (step, split, loss, grad_norm, aux..., lr, samples_per_s|tokens_per_s),
# out_dir/checkpoints/step_XXXXXXXX/, out_dir/curves.png
plot_metrics(history, path=None, *, keys=None) -> Figure   # history: records or a JSONL path
NonFiniteError                                 # raised on NaN/inf loss, names step + quantity
```

Checkpoints (atomic: temp dir + fsync + rename; arrays via `eqx.tree_serialise_leaves`):

```python
save_checkpoint(directory, step, *, model, opt_state=None, key=None, data_state=None,
                extra=None, keep=3) -> Path
load_checkpoint(path, *, model, opt_state=None) -> Checkpoint  # a checkpoint or its directory
load_latest_checkpoint(directory, *, model, opt_state=None) -> Checkpoint | None
list_checkpoints(directory) -> list[Path]
# Checkpoint(path, step, model, opt_state, key, data_state, extra); CheckpointError
```

Sharding (mesh axes `"data"` and `"model"`):

```python
make_mesh(data=None, model=1, *, devices=None) -> Mesh
shard_batch(batch, mesh, *, axis="data") -> batch          # split leading axis
param_sharding(tree, mesh, *, axis="model", min_shard_size=2**16) -> PyTree[NamedSharding]
shard_params(tree, mesh, *, axis="model", min_shard_size=2**16) -> tree
```
"""

from ._checkpoint import (
    Checkpoint,
    CheckpointError,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
    save_checkpoint,
)
from ._optim import ParamGroup, make_optimizer, make_schedule, param_labels
from ._sharding import make_mesh, param_sharding, shard_batch, shard_params
from ._step import make_eval_step, make_train_step
from ._train import NonFiniteError, TrainResult, plot_metrics, train

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "NonFiniteError",
    "ParamGroup",
    "TrainResult",
    "list_checkpoints",
    "load_checkpoint",
    "load_latest_checkpoint",
    "make_eval_step",
    "make_mesh",
    "make_optimizer",
    "make_schedule",
    "make_train_step",
    "param_labels",
    "param_sharding",
    "plot_metrics",
    "save_checkpoint",
    "shard_batch",
    "shard_params",
    "train",
]
