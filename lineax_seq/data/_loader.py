"""Turning a per-example `MapDataset` into a sharded, shuffled, batched `IterDataset`."""

from __future__ import annotations

import copy
from collections.abc import Callable

import grain
import numpy as np

from .._checks import (
    IntLike,
    RealLike,
    check_bool,
    check_choice,
    check_int,
    check_optional_int,
    check_real,
)

__all__ = ["batch_examples"]

SPLITS = ("train", "valid", "test", "all")


def check_split(split: str, valid_fraction: RealLike, test_fraction: RealLike) -> None:
    """`ValueError` for an unknown `split` or fractions that do not leave a train split."""
    check_choice("split", split, SPLITS)
    valid_fraction = check_real("valid_fraction", valid_fraction, "nonnegative")
    test_fraction = check_real("test_fraction", test_fraction, "nonnegative")
    if valid_fraction + test_fraction >= 1:
        raise ValueError(
            "valid_fraction and test_fraction must be >= 0 with sum < 1, got "
            f"valid_fraction={valid_fraction}, test_fraction={test_fraction}"
        )


def _shard_seed(seed: int, shard: grain.sharding.ShardOptions) -> int:
    """The pipeline seed of one shard: `seed` itself when there is a single shard, else
    one drawn from `(seed, shard_index)`, so that processes shuffle and mask independently."""
    if shard.shard_count == 1:
        return seed
    return int(np.random.SeedSequence([seed, shard.shard_index]).generate_state(1)[0])


class _OnCopy:
    """Picklable `(example, rng) -> example` calling `fn` on a deep copy of the example,
    so that a transform editing it in place cannot change what the source hands out
    next."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, example, rng):
        return self.fn(copy.deepcopy(example), rng)


def batch_examples(
    examples: grain.MapDataset,
    *,
    batch_size: IntLike,
    seed: IntLike = 0,
    shuffle: bool = True,
    num_epochs: IntLike | None = None,
    drop_remainder: bool = True,
    shard_options: grain.sharding.ShardOptions | None = None,
    num_workers: IntLike = 0,
    num_threads: IntLike = 0,
    random_transform: Callable | None = None,
) -> grain.IterDataset:
    """Shard, shuffle, repeat, (randomly transform,) and batch a per-example dataset.

    The order of operations is that of grain's own `DataLoader`:

    1. **shard** across JAX processes: process `i` of `n` keeps examples `i, i+n, ...`
        (`shard_options`, default `grain.sharding.ShardByJaxProcess(drop_remainder=True)`,
        so that every process sees the same number of examples and takes the same
        number of steps);
    2. **shuffle** globally within the shard, differently (but deterministically) each
        epoch, seeded by `seed` (with several shards, by `seed` and the shard index, so
        that every process draws its own permutations and random transforms);
    3. **repeat** for `num_epochs` (`None`: forever);
    4. apply `random_transform(example, rng)` (a per-position `np.random.Generator`,
        so a transform applied here, like dynamic MLM masking, differs every epoch) to a
        deep copy of the example, which it may edit in place;
    5. **batch** `batch_size` examples (per process) into stacked NumPy arrays;
    6. read with `num_threads` threads, and with `num_workers > 0` prefetch in that many
        worker processes (`IterDataset.mp_prefetch`).

    `iter(dataset)` gives a grain `DatasetIterator` whose `get_state()` /
    `set_state(state)` save and restore its exact position (a small JSON-able dict).
    The state's layout depends on `num_workers`: restore it into a pipeline built
    with the same `num_workers`.

    **Arguments:**

    - `examples`: a `grain.MapDataset` of examples (PyTrees of NumPy arrays).
    - `batch_size`: examples per batch, per process (positive).
    - `seed`: seed of the shuffle and of `random_transform` (a non-negative integer).
    - `shuffle`: whether to shuffle.
    - `num_epochs`: passes over the data; `None` repeats forever.
    - `drop_remainder`: drop a last incomplete batch (keeps shapes static under `jit`);
        for an evaluation pass (`num_epochs=1`) give `False` to keep every example
        ([`lineax_seq.train`][] weights a shorter last batch by its size).
    - `shard_options`: a `grain.sharding.ShardOptions`; `grain.sharding.NoSharding()`
        disables sharding.
    - `num_workers`: worker processes for `mp_prefetch` (0: in this process). grain
        reads absl flags; outside an absl app (flags not yet parsed) `num_workers > 0`
        marks them parsed, so they keep their defaults.
    - `num_threads`: reader threads (`grain.ReadOptions`; 0: read in the calling thread).
    - `random_transform`: optional `fn(example, rng) -> example`, picklable if
        `num_workers > 0`.

    **Returns:**

    A `grain.IterDataset` of batches.
    """
    if not isinstance(examples, grain.MapDataset):
        raise TypeError(
            "examples must be a grain.MapDataset (e.g. grain.MapDataset.source(records)), got "
            f"{type(examples).__name__}"
        )
    batch_size = check_int("batch_size", batch_size)
    num_epochs = check_optional_int("num_epochs", num_epochs)
    seed = check_int("seed", seed, minimum=0)
    num_workers = check_int("num_workers", num_workers, minimum=0)
    num_threads = check_int("num_threads", num_threads, minimum=0)
    check_bool("shuffle", shuffle)
    check_bool("drop_remainder", drop_remainder)
    if shard_options is not None and not isinstance(shard_options, grain.sharding.ShardOptions):
        raise TypeError(
            "shard_options must be a grain.sharding.ShardOptions (e.g. "
            f"grain.sharding.ShardByJaxProcess()) or None, got shard_options={shard_options!r}"
        )
    if random_transform is not None and not callable(random_transform):
        raise TypeError(f"random_transform must be callable, got {random_transform!r}")
    shard = shard_options if shard_options is not None else grain.sharding.ShardByJaxProcess(True)
    ds = examples
    n = len(ds)
    if shard.shard_count > 1:
        if shard.drop_remainder:
            ds = ds[: n - n % shard.shard_count]
        ds = ds[shard.shard_index :: shard.shard_count]
    if len(ds) == 0:
        raise ValueError(f"no examples left for shard {shard.shard_index} of {shard.shard_count}")
    if drop_remainder and num_epochs is not None and len(ds) * num_epochs < batch_size:
        raise ValueError(
            f"batch_size={batch_size} is larger than the {len(ds) * num_epochs} examples "
            "available (per process) with drop_remainder=True"
        )
    ds = ds.seed(_shard_seed(seed, shard))
    if shuffle:
        ds = ds.shuffle()
    if num_epochs != 1:
        ds = ds.repeat(num_epochs)
    if random_transform is not None:
        ds = ds.random_map(_OnCopy(random_transform))
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    it = ds.to_iter_dataset(
        grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=max(num_threads, 1) * 4)
    )
    if num_workers > 0:
        from absl import flags

        if not flags.FLAGS.is_parsed():
            # grain's workers read absl flags; outside an absl app use their defaults.
            flags.FLAGS.mark_as_parsed()
        it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
    return it
