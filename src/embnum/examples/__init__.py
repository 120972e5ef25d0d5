"""Tour and benchmark inputs, one module per family (see ``embnum._registry.Op.example_fn``)."""
