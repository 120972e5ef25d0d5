"""Numba host kernels, one module per family (never imports torch or embnum.cuda)."""
