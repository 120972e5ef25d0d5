"""Realistic inputs for the tour (``python -m embnum tour``) and the benchmarks, one module per
family, kept apart from the declarations (``embnum.ops.<family>``): ``@example(op)`` attaches
``fn(rng, size) -> Example`` to an op; the registry imports a family's module the first time
an op's ``example_fn`` is asked for."""
