"""The NumPy oracle: one plain, readable module per family (no Numba, CuPy or torch)."""
