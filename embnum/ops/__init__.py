"""Op declarations, one module per family. Importing this package registers them all."""
from . import jagged  # noqa: F401
from . import keyed_tensor  # noqa: F401
from . import kjt  # noqa: F401
from . import quant  # noqa: F401
from . import tbe  # noqa: F401
from . import tbe_quantized  # noqa: F401

FAMILIES = ("jagged", "keyed_tensor", "kjt", "quant", "tbe", "tbe_quantized")
