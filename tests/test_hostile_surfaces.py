"""The adversarial tier beyond the ops: containers, ``KeyedTensor.regroup``, the torch modules,
``TBEOptimizer``, checkpoints, the sharded collection (on a one-process gloo group), the fbgemm
stand-in's classes and the ``torch.ops.fbgemm`` aliases (``hostile_surfaces.py``).

Every case runs in the worker subprocess of ``test_hostile.py`` (a crash fails the case, not
the run). A case passes when every kind (NumPy on ref, NumPy on cpu, torch) gives a clean
error naming an argument with its inputs unchanged, or a result; and the result is the
plain-Python model's where the model has a verdict (an input it rejects must be an error on
every kind; an input it accepts must give its result), else the same on every kind. A result
for an input the model rejects, or another result, is counted as *wrong*. The cases of an
alias with an embnum op behind it are the op's own (``hostile.py``), called as
``torch.ops.fbgemm.<name>`` and compared with ref; the aliases without one (and
``permute_2D_sparse_data_input1D``, whose arguments differ from its op's) are surfaces.
``--hostile-examples=N`` draws ``N // 3`` cases per surface and ``N // 6`` per alias (the CI
profile: 4 and 2; the long runs in ``docs/containers.md`` used 600 and 900).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import embnum
import hostile
import hostile_surfaces as S

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def worker():
    w = hostile.Worker()
    yield w
    w.close()


@pytest.fixture(scope="module")
def surface_counts(request):
    import collections

    counts = collections.Counter()
    yield counts
    prefix = "surfaces: "
    request.config.hostile_counts.update({prefix + k: v for k, v in counts.items()})


def _draw(strategy_of, base_of, name, n):
    cases = []

    @settings(
        max_examples=n,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(data=st.data(), seed=st.integers(0, 7))
    def draw(data, seed):
        cases.append((seed, data.draw(strategy_of(base_of(seed)))))

    draw()
    return cases


@pytest.mark.parametrize("name", list(S.SURFACES))
def test_hostile_surface(name, worker, surface_counts, hostile_examples):
    base_fn, _, _, kinds = S.SURFACES[name]
    drawn = _draw(S.mutations, base_fn, name, max(2, hostile_examples // 3))
    for seed in range(2):  # the unmutated input is valid: a result on every kind (else mutations test nothing)
        verdict = worker.run((name, seed, ("none", None), kinds))
        assert all(o[0] in ("ok", "na") for o in verdict["outcomes"].values()), (seed, verdict)
    cases = [(name, s, m, kinds) for s, m in drawn]
    failures = hostile.run_cases(worker, surface_counts, cases)
    assert not failures, "\n".join(failures[:60])


def _aliases():
    from embnum.torch_bridge.fbgemm_aliases import ALIASES

    # permute_2D_sparse_data_input1D (lengths flattened plus a stride: the op's example does not fit
    # its schema) and the aliases with no embnum op behind them are surfaces (hostile_stand_in.py)
    return [(n, e) for n, (_, e, _) in ALIASES.items() if e is not None and n != "permute_2D_sparse_data_input1D"]


@pytest.mark.parametrize("alias,op_name", _aliases())
def test_hostile_fbgemm_alias(alias, op_name, worker, surface_counts, hostile_examples):
    op = embnum.get_op(op_name)
    import numpy as np

    base = op.bind((), op.example_fn(np.random.default_rng(0), "small").args)
    n = max(1, hostile_examples // 6)
    drawn = _draw(lambda b: hostile.mutations(b), lambda s: base, alias, n)
    backends = ("ref", f"alias:{alias}")
    cases = [(op_name, 0, ("none", None), backends)] + [(op_name, 0, m, backends) for _, m in drawn]
    failures = hostile.run_cases(worker, surface_counts, cases)
    assert not failures, "\n".join(failures[:60])


# -- the cases of the issue, through the worker -------------------------------------------------------
ISSUE_CASES = [
    ("KeyedJaggedTensor(lengths=)", 0, ("entry", ("lengths", None), 0.0, 2**63 - 1)),
    ("KeyedJaggedTensor.from_offsets_sync", 1, ("entry", ("offsets", None), 0.5, -(2**63))),
    ("TBEOptimizer", 4, ("float", ("beta2", None), "1 - 1e-11")),
    ("TBEOptimizer", 4, ("float", ("learning_rate", None), "1e39")),
    ("TBEOptimizer", 0, ("float", ("max_norm", None), "1e-50")),
    ("TBEOptimizer", 8, ("float", ("eta", None), "3.5e38")),
    ("TBEOptimizer", 0, ("value", ("kind", None), "[]")),
    ("EmbeddingBagCollection.load_state_dict", 1, ("fentry", ("embedding_bags.t0.momentum1", None), 0.0, "-1.0")),
    ("EmbeddingBagCollection.load_state_dict", 2, ("fentry", ("embedding_bags.t1.weight", None), 0.5, "nan")),
    ("EmbeddingBagCollection.load_state_dict", 2, ("entry", ("embedding_bags.t0.step", None), 0.0, -1)),
    ("KeyedJaggedTensor.permute", 1, ("entry", ("indices_tensor", None), 0.0, 2**32)),
    ("KeyedJaggedTensor.bucketize", 2, ("entry", ("block_sizes", None), 0.0, 2**32 + 3)),
]


@pytest.mark.parametrize("case", ISSUE_CASES, ids=[f"{c[0]}-{c[2][1][0]}" for c in ISSUE_CASES])
def test_issue_cases_through_the_worker(case, worker, surface_counts):
    name, seed, mutation = case
    failures = hostile.run_cases(worker, surface_counts, [(name, seed, mutation, S.SURFACES[name][3])])
    assert not failures, "\n".join(failures)
