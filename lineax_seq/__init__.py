"""Linear long-range sequence models in JAX and Equinox.

Every public name is re-exported here flat, e.g. `lineax_seq.S4D`, `lineax_seq.BiGS`,
`lineax_seq.BlockStateTransformerLM`, `lineax_seq.KoopmanAutoencoder`.
"""

from . import attention, bigs, bst, data, koopman, ssm, systems, training
from .attention import *
from .bigs import *
from .bst import *
from .data import *
from .koopman import *
from .ssm import *
from .systems import *
from .training import *

__version__ = "0.1.0"

__all__ = []
__all__ += attention.__all__
__all__ += bigs.__all__
__all__ += bst.__all__
__all__ += data.__all__
__all__ += koopman.__all__
__all__ += ssm.__all__
__all__ += systems.__all__
__all__ += training.__all__
