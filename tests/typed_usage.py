"""The public constructors called as the docs call them, for a user's type checker.

`make lint` runs pyright over this file (see `[tool.pyright]` in pyproject.toml): an
Equinox module whose `__init__` pyright cannot see (e.g. one inherited from a base
class, where pyright synthesises a dataclass `__init__` from the fields instead) fails
there. `test_package.py` runs `build_all` too, so every call here is a valid one.
"""

import jax.random as jr
import tokenizers

import lineax_seq as ls


def build_all(key) -> list[object]:
    """One instance of every public class that has a constructor to call."""
    k = iter(jr.split(key, 32))
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    bpe.add_special_tokens(["<pad>", "<bos>", "<eos>", "<unk>", "<cls>", "<sep>", "<mask>"])
    return [
        # SSM core
        ls.S4DKernel(8, 4, key=next(k)),
        ls.S4D(4, state_size=8, key=next(k)),
        ls.HyenaFilter(4, max_length=16, order=8, key=next(k)),
        # attention
        ls.MultiHeadAttention(8, 2, key=next(k)),
        ls.RelativePositionBias(2, num_buckets=8, max_distance=16, key=next(k)),
        ls.SlidingWindowAttention(8, 2, 4, key=next(k)),
        # BST
        ls.ContextSSM(8, 4, 2, key=next(k)),
        ls.SlidingWindowLayer(8, 2, 4, key=next(k)),
        ls.BlockStateTransformerLayer(8, 2, 4, context="sh", key=next(k)),
        ls.BlockRecurrentTransformerLayer(8, 2, 4, num_states=4, key=next(k)),
        ls.BlockStateTransformerLM(32, dim=8, num_layers=2, num_heads=2, window=4, key=next(k)),
        # BiGS
        ls.DirectionalSSM(8, state_size=4, key=next(k)),
        ls.GatedLayer(8, inner_dim=24, key=next(k)),
        ls.StackLayer(8, num_heads=2, key=next(k)),
        ls.BiGS(32, dim=8, num_layers=1, key=next(k)),
        ls.MaskedLMHead(8, 32, key=next(k)),
        ls.SequenceClassificationHead(8, 3, key=next(k)),
        ls.SpanExtractionHead(8, key=next(k)),
        ls.MultipleChoiceHead(8, key=next(k)),
        # Koopman
        ls.LinearKoopmanDynamics(4, dt=0.01, key=next(k)),
        ls.MLPDynamics(4, width=8, key=next(k)),
        ls.UnitNormLinear(4, 2, key=next(k)),
        ls.KoopmanAutoencoder(2, latent_dim=4, width=8, dt=0.01, key=next(k)),
        ls.MLPBaseline(2, width=8, key=next(k)),
        # systems
        ls.ParabolicAttractor(mu=-0.1, lam=-1.0),
        ls.Pendulum(g=9.81),
        ls.ControlledPendulum(damping=0.1),
        ls.Duffing(),
        ls.LotkaVolterra(alpha=0.2),
        ls.Lorenz63(rho=28.0),
        # data and training
        ls.ByteTokenizer(),
        ls.ListOpsTokenizer(),
        ls.BPETokenizer(bpe),
        ls.ParamGroup(instance_of=ls.S4DKernel, learning_rate=1e-3),
    ]
