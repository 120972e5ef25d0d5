"""Op declarations, one module per family. Importing this package registers them all."""
from . import jagged, keyed_tensor  # noqa: F401

FAMILIES = ("jagged", "keyed_tensor")
