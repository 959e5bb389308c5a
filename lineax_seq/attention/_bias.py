"""T5-style bucketed relative position bias."""

import functools
import math
import numbers

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._checks import IntLike, as_array, check_bool, check_int, check_key


def _check_buckets(
    num_buckets: IntLike, max_distance: IntLike, bidirectional: bool
) -> tuple[int, int]:
    """`(num_buckets, max_distance)` as Python ints, once checked."""
    check_bool("bidirectional", bidirectional)
    num_buckets = check_int("num_buckets", num_buckets)
    max_distance = check_int("max_distance", max_distance)
    min_buckets = 4 if bidirectional else 2
    if num_buckets < min_buckets or (bidirectional and num_buckets % 2):
        raise ValueError(
            f"`num_buckets` must be >= {min_buckets}"
            + (" and even when bidirectional" if bidirectional else "")
            + f", got {num_buckets}."
        )
    if max_distance <= num_buckets // (4 if bidirectional else 2):
        raise ValueError(
            f"`max_distance` must exceed the exact-bucket range, got {max_distance} "
            f"with num_buckets={num_buckets}."
        )
    return num_buckets, max_distance


def _check_range(name: str, low: int, high: int, dtype: np.typing.DTypeLike, got: str) -> None:
    """A `ValueError` naming `name` unless relative positions `[low, high]` fit `dtype`
    as JAX computes them (at least int32; int32 unless x64 is on), negated too: JAX
    would wrap them."""
    info = np.iinfo(jax.dtypes.canonicalize_dtype(np.promote_types(dtype, np.int32)))
    if low <= info.min or high > info.max:
        raise ValueError(
            f"`{name}` must give relative positions in ({info.min}, {info.max}] (JAX "
            f"computes them in {info.dtype}), got {got}."
        )


def relative_position_bucket(
    relative_position: Int[Array | np.ndarray, "*shape"],
    *,
    bidirectional: bool,
    num_buckets: IntLike = 32,
    max_distance: IntLike = 128,
) -> Int[Array, "*shape"]:
    """Map relative positions `key_position - query_position` to T5 buckets.

    Half of the buckets (per direction) hold exact distances `0, 1, ..., max_exact - 1`,
    the rest are logarithmically spaced up to `max_distance`; larger distances share the
    last bucket. Causal (`bidirectional=False`): keys in the future (positive relative
    position) share bucket 0 with distance 0 (they are normally masked out anyway).
    Bidirectional: the upper half of the buckets holds keys in the future.

    **Arguments:**

    - `relative_position`: integer array of `key_position - query_position`.
    - `bidirectional`: whether future keys get their own buckets.
    - `num_buckets`: total number of buckets, at least 2 (4 and even when
        `bidirectional`).
    - `max_distance`: distances at or beyond this share the last bucket; larger than
        the exact range `num_buckets // 2` (`// 4` when `bidirectional`).

    **Returns:**

    Integer bucket indices in `[0, num_buckets)`, same shape as `relative_position`,
    int32 (int64 for int64 positions).
    """
    num_buckets, max_distance = _check_buckets(num_buckets, max_distance, bidirectional)
    host = relative_position  # as given: JAX may wrap NumPy values it cannot hold
    relative_position = as_array("relative_position", relative_position)
    dtype = jnp.result_type(relative_position)
    if not jnp.issubdtype(dtype, jnp.signedinteger):
        raise TypeError(
            "`relative_position` must have a signed integer dtype (key - query positions "
            f"may be negative), got dtype {dtype}."
        )
    if not isinstance(host, jax.Array) and np.size(host):
        host = np.asarray(host)
        low, high = int(host.min()), int(host.max())
        got = f"values in [{low}, {high}]"
        _check_range("relative_position", low, high, host.dtype, got)
    # In at least int32: negating int8's -128 (or int16's minimum) would wrap.
    wide = dtype if jnp.dtype(dtype).itemsize >= 4 else jnp.int32
    n = -jnp.asarray(relative_position).astype(wide)
    offset = jnp.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        offset = jnp.where(n < 0, num_buckets, 0)
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    # Log-spaced buckets for max_exact <= n < max_distance: one more per threshold passed,
    # the thresholds found on the host with T5's formula in float64 (XLA's float32 log
    # put a distance on an exact boundary, e.g. 10 of 100 with max_exact 1, one below).
    thresholds = jnp.asarray(_log_thresholds(num_buckets, max_distance), n.dtype)
    passed = jnp.searchsorted(thresholds, n, side="right", method="compare_all")
    large = jnp.where(n < max_distance, max_exact + passed.astype(n.dtype), num_buckets - 1)
    return offset + jnp.where(n < max_exact, n, large)


@functools.cache
def _log_thresholds(num_buckets: int, max_distance: int) -> tuple[int, ...]:
    """The smallest distance in each log-spaced bucket after the first (`num_buckets`
    per direction), where T5's formula `max_exact + floor(log(n / max_exact) /
    log(max_distance / max_exact) * (num_buckets - max_exact))` reaches it."""
    max_exact, span = num_buckets // 2, math.log(max_distance / (num_buckets // 2))
    bucket = lambda n: max_exact + int(math.log(n / max_exact) / span * (num_buckets - max_exact))
    thresholds = []
    for b in range(max_exact + 1, num_buckets):
        start = max_exact * math.exp((b - max_exact) / (num_buckets - max_exact) * span)
        n = max(max_exact, math.floor(start) - 2)
        while bucket(n) < b:
            n += 1
        thresholds.append(n)
    return tuple(thresholds)


class RelativePositionBias(eqx.Module):
    """T5 relative position bias: one learned scalar per (bucket, head).

    The bias for query position `i` and key position `j` is `table[bucket(j - i), h]`,
    added to the attention logits of head `h`. Query positions are
    `query_offset + arange(query_length)` and key positions are `arange(key_length)`,
    so a query block that sits after `query_offset` cached keys (sliding-window blocks,
    incremental decoding) gets the right distances.
    """

    embedding: Float[Array, "num_buckets num_heads"]
    num_heads: int = eqx.field(static=True)
    num_buckets: int = eqx.field(static=True)
    max_distance: int = eqx.field(static=True)
    bidirectional: bool = eqx.field(static=True)

    def __init__(
        self,
        num_heads: IntLike,
        *,
        num_buckets: IntLike = 32,
        max_distance: IntLike = 128,
        bidirectional: bool = False,
        key: PRNGKeyArray,
    ):
        """**Arguments:**

        - `num_heads`: number of attention heads (one bias per head).
        - `num_buckets`: number of distance buckets (T5: 32).
        - `max_distance`: distance beyond which all keys share the last bucket (T5: 128).
        - `bidirectional`: separate buckets for keys after the query (encoders).
        - `key`: PRNG key for the table's initialisation (normal, standard deviation
            0.02).
        """
        check_key("key", key)
        num_heads = check_int("num_heads", num_heads)
        num_buckets, max_distance = _check_buckets(num_buckets, max_distance, bidirectional)
        self.embedding = 0.02 * jr.normal(key, (num_buckets, num_heads))
        self.num_heads = num_heads
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional

    def buckets(
        self,
        query_length: IntLike,
        key_length: IntLike,
        *,
        query_offset: IntLike | Int[Array, ""] = 0,
    ) -> Int[Array, "query_length key_length"]:
        """Bucket index of every (query, key) pair: `query_length` queries from position
        `query_offset` on, `key_length` keys from 0 (see `__call__`).

        Returns an integer array `(query_length, key_length)`.
        """
        query_length = check_int("query_length", query_length)
        key_length = check_int("key_length", key_length)
        if isinstance(query_offset, bool) or not (
            isinstance(query_offset, numbers.Integral)
            or (
                isinstance(query_offset, jax.Array | np.ndarray)
                and query_offset.shape == ()
                and jnp.issubdtype(query_offset.dtype, jnp.integer)
            )
        ):
            raise TypeError(
                "`query_offset` must be an integer or a scalar integer array, got "
                f"query_offset={query_offset!r}."
            )
        # Positions in the offset's integer type (a decoding cache's int32 under x64 too).
        dtype = (
            jnp.result_type(query_offset)
            if isinstance(query_offset, jax.Array | np.ndarray | np.generic)
            else jnp.int32
        )
        if not isinstance(query_offset, jax.Array):  # a host value, which JAX would wrap
            first = int(query_offset)
            last = first + query_length - 1  # the last query's position
            low = min(first, -last, 0)
            high = max(last, key_length - 1, key_length - 1 - first)
            got = f"query_offset={query_offset!r} (positions in [{low}, {high}])"
            _check_range("query_offset", low, high, dtype, got)
        q_pos = query_offset + jnp.arange(query_length, dtype=dtype)
        k_pos = jnp.arange(key_length, dtype=dtype)
        return relative_position_bucket(
            k_pos[None, :] - q_pos[:, None],
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )

    def __call__(
        self,
        query_length: IntLike,
        key_length: IntLike,
        *,
        query_offset: IntLike | Int[Array, ""] = 0,
    ) -> Float[Array, "heads query_length key_length"]:
        """Additive attention bias.

        **Arguments:**

        - `query_length`: number of queries.
        - `key_length`: number of keys (key positions `0 .. key_length - 1`).
        - `query_offset`: position of the first query (e.g. the number of cached keys in
          front of the query block); a Python int or a traced scalar (decoding).

        **Returns:**

        The bias, shape `(num_heads, query_length, key_length)`, ready for the `bias=`
        argument of [`lineax_seq.MultiHeadAttention`][].
        """
        buckets = self.buckets(query_length, key_length, query_offset=query_offset)
        return jnp.moveaxis(self.embedding[buckets], -1, 0)
