"""Vector loads for the Numba-CUDA kernels: four consecutive elements of a 1-D array in one
instruction (``ld.global.v4.f32``: 16 bytes for float32, ``ld.global.v4.b16``: 8 bytes for
float16).

:func:`load4` ``(a, i)`` returns ``(a[i], a[i+1], a[i+2], a[i+3])``. On a GPU it is one aligned
vector load: the caller must know that ``a``'s data pointer plus ``i`` elements is a multiple of
four elements' bytes (the kernels check the pointer on the host and the offsets in the kernel, and
take their scalar path otherwise); a misaligned vector load is a fault, not a wrong value. Under
the simulator it is four scalar reads (the simulator runs Python and has no vector types).
"""

from __future__ import annotations

from .._backend import cuda_simulated

if cuda_simulated():

    def load4(a, i):
        """``(a[i], a[i + 1], a[i + 2], a[i + 3])`` (simulator: four reads)."""
        return a[i], a[i + 1], a[i + 2], a[i + 3]

else:
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def load4(typingctx, a, i):
        """``(a[i], a[i + 1], a[i + 2], a[i + 3])`` of a C-contiguous 1-D array in one vector load,
        aligned to four elements (see the module docstring)."""
        if not (isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" and isinstance(i, types.Integer)):
            return None
        sig = types.UniTuple(a.dtype, 4)(a, i)

        def codegen(context, builder, sig, args):
            aty, ity = sig.args
            ary = context.make_array(aty)(context, builder, value=args[0])
            idx = context.cast(builder, args[1], ity, types.intp)
            ptr = cgutils.get_item_pointer(context, builder, aty, ary, [idx])
            elt = context.get_value_type(aty.dtype)
            vec = builder.load(
                builder.bitcast(ptr, ir.VectorType(elt, 4).as_pointer()), align=4 * aty.dtype.bitwidth // 8
            )
            return context.make_tuple(
                builder,
                sig.return_type,
                [builder.extract_element(vec, ir.Constant(ir.IntType(32), k)) for k in range(4)],
            )

        return sig, codegen
