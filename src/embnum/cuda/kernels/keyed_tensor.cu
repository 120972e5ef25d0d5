// Pooled-embedding permutes (embnum keyed_tensor family), one launch for all outputs.
//
// The host plans a permute as a table of row segments (embnum/_permute_plan.py)
// and passes device pointer arrays for the inputs and outputs, so any number of
// arrays of any row stride is served by one launch and nothing is concatenated.
//
// kt_copy:        segs [S, 5] int64 = (src array or -1 for zeros, src col, dst array,
//                 dst col, n). One warp per (segment, batch row) in a grid-stride loop;
//                 16-byte vector loads/stores when both row pointers and the byte count
//                 allow it, a scalar tail, element copies otherwise.
// kt_accumulate_*: slots [E, 5] = (gradient array, col, n, first source, end source),
//                 srcs [K, 2] = (grad_outputs array, col). Each thread owns one element
//                 of a slot row and adds its sources in permutes row order, starting from
//                 0 (float16: rounded after every addition). No atomics: deterministic.
// All offsets are 64-bit (B x D may pass 2^31).

typedef long long i64;
typedef unsigned long long u64;

#ifndef EMBNUM_HOST_SHIM
__device__ __forceinline__ float h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short f2h(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#endif

template <typename E>
__device__ __forceinline__ void copy_elems(char* d, const char* s, i64 first, i64 end, int lane) {
    for (i64 i = first + lane; i < end; i += 32) {
        reinterpret_cast<E*>(d)[i] = s ? reinterpret_cast<const E*>(s)[i] : E(0);
    }
}

// Copy (s != nullptr) or zero (s == nullptr) nbytes, elements of itemsize bytes.
__device__ __forceinline__ void copy_row(char* d, const char* s, i64 nbytes, int itemsize, int lane) {
    i64 done = 0;
    if (((reinterpret_cast<u64>(d) | reinterpret_cast<u64>(s)) & 15) == 0) {
        const i64 nvec = nbytes >> 4;
        uint4* dv = reinterpret_cast<uint4*>(d);
        const uint4* sv = reinterpret_cast<const uint4*>(s);
        for (i64 i = lane; i < nvec; i += 32) {
            dv[i] = s ? sv[i] : make_uint4(0, 0, 0, 0);
        }
        done = nvec << 4;
    }
    // scalar tail (or the whole row when unaligned), element by element
    char* dt = d + done;
    const char* st = s ? s + done : nullptr;
    const i64 rest = (nbytes - done) / itemsize;
    switch (itemsize) {
        case 2: copy_elems<unsigned short>(dt, st, 0, rest, lane); break;
        case 4: copy_elems<unsigned int>(dt, st, 0, rest, lane); break;
        case 8: copy_elems<u64>(dt, st, 0, rest, lane); break;
        default: copy_elems<unsigned char>(dt, st, 0, rest * itemsize, lane); break;
    }
}

extern "C" __global__ void kt_copy(const i64* __restrict__ segs, i64 S, i64 B,
                                   const char* const* __restrict__ srcs, const i64* __restrict__ src_strides,
                                   char* const* __restrict__ dsts, const i64* __restrict__ dst_strides,
                                   int itemsize) {
    const int lane = threadIdx.x & 31;
    const i64 warp = (blockIdx.x * (i64)blockDim.x + threadIdx.x) >> 5;
    const i64 n_warps = ((i64)gridDim.x * blockDim.x) >> 5;
    for (i64 p = warp; p < S * B; p += n_warps) {
        const i64 s = p / B;
        const i64 b = p - s * B;
        const i64* g = segs + 5 * s;
        const i64 i = g[0], a = g[1], j = g[2], c = g[3], n = g[4];
        char* d = dsts[j] + b * dst_strides[j] + c * itemsize;
        const char* src = i < 0 ? nullptr : srcs[i] + b * src_strides[i] + a * itemsize;
        copy_row(d, src, n * itemsize, itemsize, lane);
    }
}

struct F16 {
    typedef unsigned short T;
    __device__ static T zero_plus(T x) { return f2h(0.0f + h2f(x)); }
    __device__ static T add(T acc, T x) { return f2h(h2f(acc) + h2f(x)); }
};
template <typename V>
struct Native {
    typedef V T;
    __device__ static T zero_plus(T x) { return V(0) + x; }
    __device__ static T add(T acc, T x) { return acc + x; }
};

template <typename Ops>
__device__ void accumulate(const i64* __restrict__ slots, i64 E, const i64* __restrict__ srcs, i64 B,
                           const char* const* __restrict__ grads, const i64* __restrict__ grad_strides,
                           char* const* __restrict__ dsts, const i64* __restrict__ dst_strides) {
    typedef typename Ops::T T;
    // one (slot, row) pair per block in a grid-stride loop; threads across the slot's columns
    for (i64 p = blockIdx.x; p < E * B; p += gridDim.x) {
        const i64 e = p / B;
        const i64 b = p - e * B;
        const i64* sl = slots + 5 * e;
        const i64 i = sl[0], x0 = sl[1], n = sl[2], k0 = sl[3], k1 = sl[4];
        T* d = reinterpret_cast<T*>(dsts[i] + b * dst_strides[i]) + x0;
        for (i64 x = threadIdx.x; x < n; x += blockDim.x) {
            T acc = T(0);
            for (i64 k = k0; k < k1; ++k) {
                const i64 j = srcs[2 * k], col = srcs[2 * k + 1];
                const T v = reinterpret_cast<const T*>(grads[j] + b * grad_strides[j])[col + x];
                acc = k == k0 ? Ops::zero_plus(v) : Ops::add(acc, v);
            }
            d[x] = acc;
        }
    }
}

#define EMBNUM_ACCUMULATE(NAME, OPS)                                                                   \
    extern "C" __global__ void NAME(const i64* slots, i64 E, const i64* srcs, i64 B,                   \
                                    const char* const* grads, const i64* grad_strides,                 \
                                    char* const* dsts, const i64* dst_strides) {                       \
        accumulate<OPS>(slots, E, srcs, B, grads, grad_strides, dsts, dst_strides);                   \
    }
EMBNUM_ACCUMULATE(kt_accumulate_f16, F16)
EMBNUM_ACCUMULATE(kt_accumulate_f32, Native<float>)
EMBNUM_ACCUMULATE(kt_accumulate_f64, Native<double>)
