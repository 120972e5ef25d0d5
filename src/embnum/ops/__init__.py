"""Op declarations, one module per family. Importing this package registers them all.

The families are the modules of this package (found once, here, with ``pkgutil``):
adding a family means adding its module; no list names it.
"""

import importlib
import pkgutil

FAMILIES = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")))
for _family in FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")
del _family
