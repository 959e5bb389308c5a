"""`jax.export` of the models' forward passes.

Their checks of traced values (token ids in range, trailing-padding masks, finite
states) are host callbacks, which `jax.export` cannot serialise; with Equinox's
`EQX_ON_ERROR=nan` they are left out and the models export.
"""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
from jax import export

import lineax_seq as ls


def _models():
    tokens = jr.randint(jr.key(1), (16,), 0, 50)
    mask = jnp.arange(16) < 12
    bigs = ls.BiGS.from_config("bigs-tiny", vocab_size=50, key=jr.key(0))
    lm = ls.BlockStateTransformerLM.from_variant(
        "BST:SH:S4", 50, 16, 2, num_heads=2, window=4, key=jr.key(2)
    )
    koopman = ls.KoopmanAutoencoder(2, 4, width=8, key=jr.key(3))
    x0 = jnp.array([0.5, -0.2])
    return {
        "bigs": (lambda t, m: bigs(t, m, inference=True), (tokens, mask)),
        "bst": (lambda t: lm(t), (tokens,)),
        "koopman": (lambda x: ls.unroll(koopman, x, steps=20, reencode_every=5), (x0,)),
    }


@pytest.mark.parametrize("name", ["bigs", "bst", "koopman"])
def test_models_export_with_eqx_on_error_nan(name, monkeypatch):
    fn, args = _models()[name]
    monkeypatch.setenv("EQX_ON_ERROR", "nan")
    exported = export.export(jax.jit(fn))(*args)
    np.testing.assert_allclose(exported.call(*args), jax.jit(fn)(*args), rtol=1e-6, atol=1e-6)


def test_traced_checks_are_callbacks_without_it(monkeypatch):
    """Without the setting the checks stay in the program (and `jax.export` refuses it)."""
    monkeypatch.delenv("EQX_ON_ERROR", raising=False)
    fn, args = _models()["bigs"]
    with pytest.raises(NotImplementedError, match="host_callbacks"):
        export.export(jax.jit(fn))(*args)
