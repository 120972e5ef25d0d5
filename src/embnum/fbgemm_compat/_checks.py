"""Checks the stand-in modules share: their arguments named in fbgemm's terms (``embedding_specs[0]
rows``, ``max_norm``, ``indices``), their checkpoints checked before anything is copied, and an id
outside its table named by feature, table, sample and bag."""

from __future__ import annotations

import numbers

import numpy as np
import torch

from .._tbe import _finite
from .._validate import AllocationError, integer
from ..modules import _state
from ..modules.tbe import first_out_of_range, out_of_range_text


def enum(name, value, enum_cls):
    """``value`` as a member of ``enum_cls`` (an ``IntEnum``: a member, or an int equal to a member's
    value), else ``ValueError`` naming ``name``. A bool, a float or an array equal to a value is no
    member (``IntEnum`` itself would read ``True`` or ``1.0`` as the member of value 1)."""
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        try:
            return enum_cls(int(value))
        except ValueError:
            pass
    raise ValueError(f"{name} must be a {enum_cls.__name__}, got {value!r}")


def specs(cls_name: str, embedding_specs, fields: tuple, min_rows: int = 1) -> list[tuple]:
    """``embedding_specs`` as a list of tuples of ``len(fields)`` (the field names, fbgemm's order);
    the ``"rows"`` entry an int ``>= min_rows``, the ``"dim"`` entry an int ``>= 1`` (as Python ints)."""
    what = ", ".join(fields)
    if not isinstance(embedding_specs, (list, tuple)) or not embedding_specs:
        got = f"{embedding_specs!r:.80}"
        raise TypeError(f"{cls_name}: embedding_specs must be a non-empty list of ({what}), got {got}")
    out = []
    for i, s in enumerate(embedding_specs):
        if not isinstance(s, (list, tuple)) or len(s) != len(fields):
            raise ValueError(f"{cls_name}: embedding_specs[{i}] must be ({what}), got {s!r:.80}")
        s = list(s)
        for field, low in (("rows", min_rows), ("dim", 1)):
            if field in fields:
                k = fields.index(field)
                s[k] = integer(f"embedding_specs[{i}] {field}", s[k], min=low, max=2**40, what="an int")
        out.append(tuple(s))
    return out


def allocate(what: str, make, n: int):
    """``make()`` (a tensor of ``n`` elements for the tables of ``embedding_specs``); torch's
    allocation failure as an :class:`~embnum._validate.AllocationError` naming ``what``."""
    try:
        return make()
    except (RuntimeError, MemoryError) as e:
        if isinstance(e, RuntimeError) and "allocate" not in str(e):
            raise
        raise AllocationError(f"embedding_specs: the {what} ({n} elements) do not fit in memory") from None


def number(name: str, x, *, minimum=None) -> float:
    """A real number finite in float32 (the kernels' precision) and ``>= minimum``, as a float."""
    _finite(name, x, minimum=minimum)
    return float(x)


def step(name: str, x) -> int:
    return integer(name, x, min=0, max=_state.MAX_STEP, what="an int step")


def device(name: str, value) -> torch.device:
    try:
        return torch.device(value)
    except (RuntimeError, TypeError, ValueError) as e:
        raise ValueError(f"{name} must be a torch.device or a device name, got {value!r} ({e})") from None


def table_map(feature_table_map, n_tables: int) -> list[int]:
    """``feature_table_map`` (default: one feature per table) as ints in ``[0, n_tables)``."""
    if feature_table_map is None:
        return list(range(n_tables))
    if isinstance(feature_table_map, torch.Tensor):
        feature_table_map = feature_table_map.tolist()
    if not isinstance(feature_table_map, (list, tuple)) or not feature_table_map:
        raise TypeError(f"feature_table_map must be a non-empty list of table numbers, got {feature_table_map!r:.80}")
    return [
        integer(f"feature_table_map[{f}]", t, min=0, max=n_tables - 1, what=f"a table number in [0, {n_tables})")
        for f, t in enumerate(feature_table_map)
    ]


def float_weights(name: str, x):
    """``per_sample_weights``: ``None`` or a floating tensor, as float32 (what fbgemm's lookups read;
    the cast is differentiable)."""
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} must hold floats, got {x.dtype}")
    return x.float()


def lookup_error(err, indices, offsets, rows, feature_table_map, table_names=None, feature_names=None, pruned_ok=False):
    """The lookup's ``IndexError`` for an id outside its table in the user's terms: the feature (its
    name where ``feature_names`` gives one, else its position in ``feature_table_map``), its table
    (``table_names[t]`` where given, else ``t``), the sample (bag ``b`` of ``offsets`` is sample
    ``b % B`` of feature ``b // B``) and the table's range, as the modules word it
    (:func:`embnum.modules.tbe.out_of_range_text`), then the positions in fbgemm's arguments a name
    replaced, and the bag (``pruned_ok``: ``-1`` is a pruned row, not outside, as in the quantized
    lookup). ``None`` where no id is outside (``err`` then stands). The caller raises it ``from err``."""
    where = first_out_of_range(indices, offsets, rows, feature_table_map, pruned_ok=pruned_ok)
    if where is None:
        return None
    f, sample, value = where
    B = (offsets.numel() - 1) // len(feature_table_map)
    t = feature_table_map[f]
    feature = f if feature_names is None else feature_names[f]
    table = t if table_names is None else table_names[t]
    positions = [f"bag {f * B + sample}"]
    positions += [f"feature {f}"] * (feature_names is not None) + [f"table {t}"] * (table_names is not None)
    return IndexError(f"indices: {out_of_range_text(feature, table, value, sample, rows[t])} ({', '.join(positions)})")


def feature_names(feature_names_per_table, feature_table_map):
    """Each feature's name from fbgemm's ``feature_names_per_table`` (table ``t``'s features in the
    order ``feature_table_map`` lists them, as TorchRec passes them); ``None`` when not given or
    when the counts per table do not match the map (no name is then guessed)."""
    if feature_names_per_table is None:
        return None
    feature_names_per_table = [list(names) for names in feature_names_per_table]
    taken = [0] * len(feature_names_per_table)
    names = []
    for t in feature_table_map:
        if taken[t] >= len(feature_names_per_table[t]):
            return None
        names.append(feature_names_per_table[t][taken[t]])
        taken[t] += 1
    return names if taken == [len(n) for n in feature_names_per_table] else None


class CheckedState(torch.nn.Module):
    """``load_state_dict`` checks every entry of ``_state_rules()`` (``embnum.modules._state``) before
    torch copies any, and ``assign=True`` copies too (the lookups read the module's own tensors)."""

    def _state_rules(self) -> dict:
        raise NotImplementedError

    def _load_from_state_dict(self, state_dict, prefix, *args):
        _state.check(state_dict, prefix, self._state_rules())
        _state.load_without_assign(CheckedState, self, state_dict, prefix, *args)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        _state.check_keys(self, state_dict, strict)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)
