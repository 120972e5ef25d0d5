"""Numba-CUDA kernels (and CUDA C sources for CuPy RawKernels in kernels/), one module per family.

Runs on CuPy arrays on a GPU, or on NumPy arrays under Numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``). Never imports torch.
"""
