"""Linear long-range sequence models in JAX and Equinox.

Every public name is re-exported here flat, e.g. `lineax_seq.S4D`, `lineax_seq.BiGS`,
`lineax_seq.BlockStateTransformerLM`, `lineax_seq.KoopmanAutoencoder`.
"""

from .attention import *
from .bigs import *
from .bst import *
from .data import *
from .koopman import *
from .ssm import *
from .systems import *
from .training import *

__version__ = "0.1.0"
