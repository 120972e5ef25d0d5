"""Device-to-host reads per call of the cuda kjt, jagged and keyed_tensor ops.

The rule: an op on device inputs reads device data back at most once per call, and only where an
output's size depends on the data (then one read both sizes the output and validates); ops whose
output sizes follow from the shapes read nothing back, unless a documented size argument is missing.

The simulator runs kernels on NumPy arrays, where a read costs nothing and leaves no trace, so the
inputs here are :class:`Device` arrays: NumPy arrays that stay "on the device" through every
reduction and element access (a 0-d ``Device``, never a Python scalar) and count each conversion to
host data (``int()``, ``bool()``, ``float()``, ``.item()``, ``.tolist()``, ``to_host``). A check that
turns ``lengths.min()`` into a Python int is one read, as it is one ``cudaMemcpy`` with CuPy.
Each case runs in a child process (the simulator is switched on for that process only).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

# op -> most device-to-host reads allowed per call (the op's small example)
BUDGET = {
    # output sizes from the shapes: only the one read of the device checks' summary (offsets
    # rules, index ranges), none where no argument needs a check of its data
    "complete_cumsum": 1,
    "exclusive_cumsum": 1,
    "inclusive_cumsum": 1,
    "offsets_range": 1,
    "segment_sum_csr": 1,
    "segment_sum_csr_backward": 1,
    "jagged_to_padded_dense": 1,
    "jagged_1d_to_dense": 1,
    "jagged_2d_to_dense": 1,
    "dense_to_jagged": 1,
    "expand_into_jagged_permute": 1,
    "invert_permute": 1,
    # output size from the data: one read sizes and validates
    "permute_2d_sparse_data": 1,
    "permute_1d_sparse_data": 1,
    "keyed_jagged_index_select_dim1": 1,
    "block_bucketize_sparse_features": 1,
    "jagged_unique_indices": 1,
    # keyed_tensor: output sizes from host lists; the one read validates the device index tables
    # (and the fast path plans from that same copy); host-list regrouping reads nothing
    "permute_pooled_embs": 1,
    "permute_multi_embedding": 1,
    "permute_multi_embedding_backward": 1,
    "regroup_keyed_tensor": 0,
    "kt_regroup_arguments": 0,
}

_CHILD = textwrap.dedent(
    """
    import importlib, json, sys
    import numpy as np
    import embnum
    from embnum import _backend

    READS = [0]

    def _count():
        READS[0] += 1

    class Device(np.ndarray):
        def __array_wrap__(self, arr, context=None, return_scalar=False):
            return np.asarray(arr).view(Device)

        def __getitem__(self, k):
            r = super().__getitem__(k)
            return r if isinstance(r, np.ndarray) else np.asarray(r).view(Device)

        def _host(self):
            _count()
            return np.asarray(self).view(np.ndarray)

        def __int__(self):
            return int(self._host())

        def __index__(self):
            return self._host().__index__()

        def __float__(self):
            return float(self._host())

        def __bool__(self):
            return bool(self._host())

        def item(self, *a):
            return self._host().item(*a)

        def tolist(self):
            return self._host().tolist()

    original = _backend.to_host

    def counting_to_host(a, dtype=None):
        # every call counts: an array made from device data by np.asarray (cupy.asarray on a GPU)
        # is no longer a Device here, but to_host of it is a copy from the device there
        _count()
        return original(np.asarray(a).view(np.ndarray) if isinstance(a, Device) else a, dtype)

    from embnum import _registry, _validate

    # the registry turns array subclasses into plain arrays; keep them "on the device" here
    _registry._plain_arrays = lambda arguments: (arguments, _validate.arrays_in(arguments))

    for mod in list(sys.modules.values()):
        if (getattr(mod, "__name__", "") or "").startswith("embnum") and getattr(mod, "to_host", None) is original:
            mod.to_host = counting_to_host

    def on_device(x):
        if isinstance(x, np.ndarray):
            return np.ascontiguousarray(x).view(Device) if x.flags.c_contiguous else x.view(Device)
        if isinstance(x, list):
            return [on_device(y) for y in x]
        if isinstance(x, tuple):
            return tuple(on_device(y) for y in x)
        return x

    HINTS = {
        "permute_1d_sparse_data": ("permuted_lengths_sum", 1),
        "permute_2d_sparse_data": ("permuted_lengths_sum", 1),
        "keyed_jagged_index_select_dim1": ("selected_lengths_sum", 0),
    }
    result = {}
    for name in [a for a in sys.argv[1:] if not a.startswith("--")]:
        op = embnum.get_op(name)
        args = op.example_fn(np.random.default_rng(0), "small").args
        want = op.public(**args, backend="ref")
        dev = {k: on_device(v) for k, v in args.items()}
        import embnum.cuda  # noqa: F401 - imported before counting
        READS[0] = 0
        got = op.public(**dev, backend="cuda")
        result[name] = READS[0]
        err, ok = op.check_fn(got, want, args)
        assert ok, (name, err)
        hint = HINTS.get(name)
        if hint:  # the documented size argument passed: still at most the one read (it validates)
            dev[hint[0]] = int(np.asarray(want[hint[1]]).shape[0])
            READS[0] = 0
            op.public(**dev, backend="cuda")
            result[name + " with " + hint[0]] = READS[0]
        if name == "block_bucketize_sparse_features":  # every optional per-key array given
            T, n, ms = args["block_sizes"].shape[0], args["lengths"].shape[0], args["my_size"]
            extra = dict(
                batch_size_per_feature=np.full(T, n // T, np.int64),
                total_num_blocks=np.full(T, 2 * ms, np.int64),
                block_bucketize_pos=[np.arange(ms + 1, dtype=np.int64) * 3 for _ in range(T)],
                keep_orig_idx_per_feature=np.arange(T) % 2 == 0,
            )
            dev.update(on_device(extra))
            READS[0] = 0
            op.public(**dev, backend="cuda")
            result[name + " with every per-key array"] = READS[0]
    if "--tables" in sys.argv:  # the families' EDGES and BAD rows with device arrays: same verdicts
        import pytest
        sys.path.insert(0, "tests")
        failures = []
        for family in ("kjt", "jagged", "keyed_tensor"):
            mod = importlib.import_module("tables." + family)
            for case, (name, args) in mod.EDGES.items():
                op = embnum.get_op(name)
                want = op.public(**args, backend="ref")
                got = op.public(**on_device(args), backend="cuda")
                err, ok = op.check_fn(got, want, args)
                if not ok:
                    failures.append(f"EDGES {case}: {err}")
            for name, args, exc, words in mod.BAD:
                try:
                    embnum.get_op(name).public(**on_device(args), backend="cuda")
                    failures.append(f"BAD {name} {words}: no error")
                except exc as e:
                    if not all(w in str(e) for w in words):
                        failures.append(f"BAD {name}: {e!r} does not name {words}")
                except Exception as e:
                    failures.append(f"BAD {name} {words}: {e!r} instead of {exc.__name__}")
        print(json.dumps({"failures": failures}))
    else:
        print(json.dumps(result))
    """
)


def _reads(names):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    run = subprocess.run([sys.executable, "-c", _CHILD, *names], capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_reads_per_call_within_the_budget():
    reads = _reads(sorted(BUDGET))
    assert len(reads) == len(BUDGET) + 4  # three ops ran with their size hint, bucketize with every option
    over = {n: (r, BUDGET[n.split(" with ")[0]]) for n, r in reads.items() if r > BUDGET[n.split(" with ")[0]]}
    assert not over, f"device-to-host reads per call (got, allowed): {over}; all: {reads}"


def test_the_counter_sees_a_read():
    # a check that reads a device scalar back must be counted, or the budget above proves nothing
    reads = _reads(["permute_1d_sparse_data"])
    assert reads["permute_1d_sparse_data"] >= 1


def test_device_summaries_give_the_exact_checks_verdicts():
    """The one-read summaries run only on device data (host data takes the exact checks), so the
    families' EDGES and BAD tables run here once more with device arrays: the same results, and the
    same errors naming the same values."""
    assert _reads(["--tables"]) == {"failures": []}


if __name__ == "__main__":  # pragma: no cover - print the table
    print(json.dumps(_reads(sorted(BUDGET)), indent=1))
    pytest.main([__file__])
