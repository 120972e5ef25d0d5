"""Op declarations, one module per family. Importing this package registers them all."""

from . import (
    jagged,  # noqa: F401
    keyed_tensor,  # noqa: F401
    kjt,  # noqa: F401
    quant,  # noqa: F401
    tbe,  # noqa: F401
    tbe_quantized,  # noqa: F401
)

FAMILIES = ("jagged", "keyed_tensor", "kjt", "quant", "tbe", "tbe_quantized")
