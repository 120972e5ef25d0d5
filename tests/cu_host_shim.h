// Compile a CUDA C kernel file with g++ to run its logic on the host, serially:
// every (block, thread) of a launch runs the kernel body in turn. Valid only for
// kernels without __syncthreads, shared memory or atomics (embnum's keyed_tensor
// kernels). float16 conversions use _Float16 (round to nearest even).
#pragma once
#include <cstdint>
#define EMBNUM_HOST_SHIM 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
struct embnum_dim3 { unsigned x = 0, y = 0, z = 0; };
static embnum_dim3 threadIdx, blockIdx, blockDim, gridDim;
struct uint4 { unsigned x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
static inline float h2f(unsigned short h) { _Float16 v; __builtin_memcpy(&v, &h, 2); return (float)v; }
static inline unsigned short f2h(float f) { _Float16 v = (_Float16)f; unsigned short h; __builtin_memcpy(&h, &v, 2); return h; }
#define EMBNUM_LAUNCH(grid, block, call)                          \
    do {                                                          \
        gridDim.x = (grid); blockDim.x = (block);                 \
        for (unsigned bx = 0; bx < gridDim.x; ++bx)               \
            for (unsigned tx = 0; tx < blockDim.x; ++tx) {        \
                blockIdx.x = bx; threadIdx.x = tx; call;          \
            }                                                     \
    } while (0)
