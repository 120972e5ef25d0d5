"""The subprocess of the adversarial tier: judges hostile cases one after another.

Reads one base64 pickled case per line on stdin, writes one result line per case on
stdout (``@@hostile@@ <base64 pickle>``), so the parent (``test_hostile.py``) knows
which case was running if this process dies (a crash) or stops answering (a hang).
Its address space is capped (``EMBNUM_HOSTILE_MEMORY_GB``, default 6), so that an
allocation driven by a hostile size fails here as ``MemoryError`` (an unclean error)
instead of exhausting the machine.

A case is ``(op name, seed, mutation, backends)``; see ``hostile.py``. The result is
a dict: ``outcomes`` (per backend ``("ok",)``, ``("error", type, message)`` or
``("na", why)``), ``problems`` (strings; empty when the case passed) and
``named_target`` (whether the errors name the mutated argument).
"""

from __future__ import annotations

import base64
import os
import pickle
import resource
import sys
import traceback
import warnings

MARK = "@@hostile@@"


def _limit_memory():
    gb = float(os.environ.get("EMBNUM_HOSTILE_MEMORY_GB", "6"))
    limit = int(gb * 2**30)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ValueError, OSError):
        pass


class NotExpressible(Exception):
    """The mutated input cannot be written as torch tensors (e.g. an object array)."""


def _to_torch(name, args):
    import numpy as np
    import torch

    from embnum.torch_bridge import BRIDGES

    types = BRIDGES[name].types

    def tensor(a):
        if isinstance(a, np.ma.MaskedArray) or type(a) is not np.ndarray:
            raise NotExpressible(f"torch has no {type(a).__name__}")
        if not a.flags.writeable:
            raise NotExpressible("torch tensors have no read-only flag")
        try:
            return torch.from_numpy(a)
        except (TypeError, ValueError, RuntimeError) as e:
            raise NotExpressible(f"torch.from_numpy: {e}") from None

    out = {}
    for k, a in args.items():
        kind = types[k]
        if kind.startswith("Tensor[]") and isinstance(a, (list, tuple)):
            out[k] = [tensor(x) if isinstance(x, np.ndarray) else x for x in a]
        elif kind.startswith("Tensor") and isinstance(a, np.ndarray):
            out[k] = tensor(a)
        elif kind.startswith("Tensor") and isinstance(a, list) and a and all(type(x) is int for x in a):
            try:  # the NumPy API takes a list where the bridge takes a tensor (weights_tys)
                out[k] = torch.tensor(a)
            except (TypeError, ValueError, RuntimeError, OverflowError) as e:
                raise NotExpressible(f"torch.tensor({k}): {e}") from None
        elif isinstance(a, np.ndarray) and a.dtype.kind in "iu" and a.ndim == 1:
            out[k] = a.tolist()  # an int list the NumPy API takes as an array too
        else:
            out[k] = a
    return out


def _to_numpy(x):
    import numpy as np

    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a test dependency
        torch = None
    if torch is not None and isinstance(x, torch.Tensor):
        if x.dtype == torch.bfloat16:
            x = x.view(torch.uint16)
        return x.detach().numpy().copy()
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, (list, tuple)):
        return type(x)(_to_numpy(v) for v in x) if not hasattr(x, "_fields") else type(x)(*map(_to_numpy, x))
    return x


def _alias(fbgemm_name):
    """``torch.ops.fbgemm.<fbgemm_name>``, the aliases registered in this process on first use."""
    import torch

    from embnum.torch_bridge import register_fbgemm_aliases

    if "fbgemm_gpu" in sys.modules:
        raise NotExpressible("fbgemm_gpu is loaded in this process: its own ops hold the names")
    register_fbgemm_aliases()
    return getattr(torch.ops.fbgemm, fbgemm_name)


def _schema_takes(ty, x) -> bool:
    """Whether ``x`` is what a schema scalar of type ``ty`` means (torch's parser also coerces
    a 0-d array to an int, an int to a bool: fbgemm's schema, not embnum, decides those)."""
    import numbers

    import numpy as np

    optional = ty.endswith("?") or ty.startswith("Optional[")
    ty = ty.rstrip("?")
    if ty.startswith("Optional[") and ty.endswith("]"):
        ty = ty[9:-1]
    if x is None:  # the schema parser reads None for a defaulted non-optional argument as its default
        return optional or not any(ty == t for t in ("bool", "int", "SymInt", "float"))
    if ty.endswith("[]") or ty.startswith("List["):  # "SymInt[]" in a schema string, "List[int]" from torch
        inner = ty[:-2] if ty.endswith("[]") else ty[5:-1]
        return not isinstance(x, (list, tuple)) or all(_schema_takes(inner, v) for v in x)
    if ty == "bool":
        return isinstance(x, (bool, np.bool_))
    if ty in ("int", "SymInt"):
        return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))
    if ty == "float":
        return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))
    return True


def _call_alias(op, args, fbgemm_name):
    """The alias with the op's arguments in order (its schema's count of them; a later one that
    differs from the op's default has no place in fbgemm's schema: not expressible)."""
    from embnum.torch_bridge.fbgemm_aliases import ALIASES

    schema, _, adapter = ALIASES[fbgemm_name]
    f = _alias(fbgemm_name)
    n = len(f.default._schema.arguments)
    params = list(op.signature.parameters.values())
    for p in params[n:]:
        if p.name in args and args[p.name] is not p.default and not (p.default is None and args[p.name] is None):
            raise NotExpressible(f"fbgemm's schema has no {p.name}")
    for a, p in zip(f.default._schema.arguments, params[:n]):
        if not _schema_takes(str(a.type), args.get(p.name)):
            raise NotExpressible(f"fbgemm's schema coerces {p.name}={args.get(p.name)!r} to {a.type}")
    targs = _to_torch(op.name, args)
    result = f(*[targs[p.name] for p in params[:n]])
    if adapter is not None:  # dense_to_jagged: (values, offsets); the op returns the values
        result = result[0]
    return result


def _call(op, args, backend):
    if backend.startswith("alias:"):
        try:
            result = _call_alias(op, args, backend.split(":", 1)[1])
        except RuntimeError as e:
            if str(e).startswith("fbgemm::") or "Overflow when unpacking" in str(e):
                raise NotExpressible(f"fbgemm's schema refuses it: {str(e)[:200]}") from None
            raise
        if op.mutates:
            return [_to_numpy(args[k]) for k in op.mutates if args.get(k) is not None]
        return _to_numpy(result)
    if backend == "torch":
        from embnum import torch_bridge

        targs = _to_torch(op.name, args)
        result = getattr(torch_bridge, op.name)(**targs)
    else:
        result = op.public(**args, backend=backend)
    if op.mutates:
        return [_to_numpy(args[k]) for k in op.mutates if args.get(k) is not None]
    return _to_numpy(result)


def judge(case):
    import numpy as np

    import embnum
    import hostile
    import hostile_surfaces

    name, seed, mutation, backends = case
    if name in hostile_surfaces.SURFACES:
        return hostile_surfaces.judge(case)
    op = embnum.get_op(name)
    params = list(op.signature.parameters)
    if isinstance(seed, dict):  # an explicit input (the regression cases)
        base = op.bind((), seed)
    else:
        base = op.bind((), op.example_fn(np.random.default_rng(seed), "small").args)
    try:
        hostile.apply(base, mutation)
    except hostile.NotApplicable as e:
        return dict(outcomes={}, problems=[], na=str(e), named_target=False)
    target = mutation[1][0] if len(mutation) > 1 and mutation[1] else None
    outcomes, results, problems, named = {}, {}, [], True
    for backend in backends:
        args = hostile.apply(base, mutation)
        before = hostile.snapshot(args)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results[backend] = _call(op, args, backend)
            outcomes[backend] = ("ok",)
        except NotExpressible as e:
            outcomes[backend] = ("na", str(e))
            continue
        except BaseException as e:  # noqa: BLE001 - every exception is judged
            msg = str(e)
            outcomes[backend] = ("error", type(e).__name__, msg[:400])
            if not isinstance(e, hostile.CLEAN):
                tb = "".join(traceback.format_exception(e)[-3:])
                problems.append(f"{backend}: unclean {type(e).__name__}: {msg[:300]}\n{tb[-800:]}")
            elif isinstance(e, getattr(embnum._validate, "AllocationError", ())):
                outcomes[backend] = ("error", "AllocationError", msg[:400])  # sizes below MAX_SIZE, above memory
            elif not hostile.names_an_argument(msg, params + ["out"]):
                problems.append(f"{backend}: {type(e).__name__} names no argument: {msg[:300]}")
            named &= target is not None and target in msg
        skip = op.mutates if outcomes[backend][0] == "ok" else ()
        moved = hostile.changed(before, args, skip)
        if moved:
            problems.append(f"{backend}: changed inputs {moved} ({outcomes[backend][0]})")
    ref = outcomes.get("ref")
    for backend, out in outcomes.items():
        if backend == "ref" or out[0] == "na" or ref is None:
            continue
        if (out[0] == "ok") != (ref[0] == "ok"):
            if backend != "ref" and out[0] == "error" and "torch schema" in out[2]:
                outcomes[backend] = ("na", out[2])  # a value the schema cannot carry (README: Reliability)
                continue
            problems.append(f"{backend} and ref disagree: {out[:2]} vs {ref[:2]}")
        elif out[0] == "ok":
            try:
                err, ok = op.check_fn(results[backend], results["ref"], hostile.apply(base, mutation))
            except Exception as e:  # noqa: BLE001
                err, ok = repr(e), False
            if not ok:
                problems.append(f"{backend} result differs from ref (error {err})")
    return dict(outcomes=outcomes, problems=problems, na=None, named_target=named)


def main():
    _limit_memory()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    out = sys.stdout
    sys.stdout = sys.stderr  # anything a kernel prints stays off the result channel
    for line in sys.stdin:
        case = pickle.loads(base64.b64decode(line))
        try:
            verdict = judge(case)
        except BaseException as e:  # noqa: BLE001 - a failure of the judge itself is a problem too
            verdict = dict(outcomes={}, problems=[f"judge failed: {e!r}\n{traceback.format_exc()[-800:]}"], na=None)
        out.write(f"{MARK} {base64.b64encode(pickle.dumps(verdict)).decode()}\n")
        out.flush()


if __name__ == "__main__":
    main()
