"""`jax.export` of the models' forward passes.

Their checks of traced values (token ids in range, trailing-padding masks, finite
states) are host callbacks, which `jax.export` cannot serialise; with Equinox's
`EQX_ON_ERROR=nan` or `off`, set before import, they are left out and the models
export (in a fresh process: the setting is read at import).
"""

import jax
import jax.numpy as jnp
import jax.random as jr
import pytest
from _scripts import run_script
from jax import export

import lineax_seq as ls

SCRIPT = """
import jax, jax.numpy as jnp, jax.random as jr, numpy as np
from jax import export
import lineax_seq as ls

tokens = jr.randint(jr.key(1), (16,), 0, 50)
mask = jnp.arange(16) < 12
bigs = ls.BiGS.from_config("bigs-tiny", vocab_size=50, key=jr.key(0))
lm = ls.BlockStateTransformerLM.from_variant(
    "BST:SH:S4", 50, 16, 2, num_heads=2, window=4, key=jr.key(2)
)
koopman = ls.KoopmanAutoencoder(2, 4, width=8, key=jr.key(3))
cases = {
    "bigs": (lambda t, m: bigs(t, m, inference=True), (tokens, mask)),
    "bst": (lambda t: lm(t), (tokens,)),
    "koopman": (lambda x: ls.unroll(koopman, x, steps=20, reencode_every=5), (jnp.ones(2),)),
}
for name, (fn, args) in cases.items():
    exported = export.export(jax.jit(fn))(*args)
    np.testing.assert_allclose(exported.call(*args), jax.jit(fn)(*args), rtol=1e-6, atol=1e-6)
    print(name, "exported")
"""


@pytest.mark.parametrize("setting", ["nan", "off"])
def test_models_export_without_traced_checks(setting, tmp_path):
    script = tmp_path / "export.py"
    script.write_text(SCRIPT)
    result = run_script(script, tmp_path, env={"EQX_ON_ERROR": setting})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["bigs", "exported", "bst", "exported", "koopman", "exported"]


def test_traced_checks_are_callbacks_by_default():
    """By default the checks stay in the program (and `jax.export` refuses it)."""
    assert ls._checks.TRACED_CHECKS
    bigs = ls.BiGS.from_config("bigs-tiny", vocab_size=50, key=jr.key(0))
    tokens, mask = jnp.zeros(16, jnp.int32), jnp.arange(16) < 12
    with pytest.raises(NotImplementedError, match="host_callbacks"):
        export.export(jax.jit(lambda t, m: bigs(t, m, inference=True)))(tokens, mask)
