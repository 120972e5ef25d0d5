"""Numba's decorators for embnum's kernels, with an on-disk cache that many processes may share
and that is keyed on every embnum module a kernel may read.

Numba's cache (``numba.core.caching`` on the CPU, ``numba.cuda.core.caching`` for CUDA) keeps,
per kernel, an index file mapping each compiled signature to a data file ``<kernel>.<n>.nbc``,
``n`` the first number the index does not use yet, and rewrites the index without a lock. Two
processes compiling different signatures of one kernel on a cold cache both read the empty
index, both take ``.1.nbc``, and the index can end up mapping one signature to the other's
machine code, which a later process runs on arguments of the wrong type. :class:`_SafeIndex`
changes three things:

- a data file is named by a hash of its index key (signature, target, bytecode) and the
  source stamp, so two signatures never share one; it is written under a temporary name and
  renamed into place before the index names it, so an index entry always finds whole data;
- the index's read-modify-write holds an exclusive ``fcntl.flock`` on ``<index>.lock``;
- a data file holds its key, checked on load (a mismatch is a miss: the kernel compiles anew).

Numba stamps an index with a hash of the kernel's own file only: a kernel calling a helper
compiled from ``embnum/_half.py``, or sized by a constant of ``cuda/_common.py``, kept running
stale code after those changed. The stamp here (:func:`source_stamp`) hashes the kernel's
module and every embnum module it imports, transitively, as its import statements say (the
layer rules keep that set small: the backend's ``_common`` and the shared ``embnum._*`` helpers).

A CPU kernel missing from the cache is looked up once more among the kernels compiled ahead
for a baseline CPU and shipped in the package (:class:`_PrebuiltLoad`, ``embnum._prebuilt``).

``njit`` replaces ``numba.njit``; ``cuda_kernel`` replaces ``numba.cuda.jit(cache=True)``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pickle
import re

try:
    import fcntl
except ImportError:  # not POSIX: no inter-process lock (data files still never collide)
    fcntl = None  # type: ignore[assignment]

_ROOT = os.path.dirname(os.path.abspath(__file__))  # the embnum package


def _module_path(name: str) -> str | None:
    """The source file of the embnum module ``name`` (``None`` for a package or a missing one)."""
    path = os.path.join(_ROOT, *name.split(".")[1:]) + ".py"
    return path if os.path.isfile(path) else None


def _module_name(path: str) -> tuple[str, str]:
    """``(module, package)`` of an embnum source file."""
    parts = os.path.relpath(os.path.abspath(path), _ROOT)[: -len(".py")].split(os.sep)
    if parts[-1] == "__init__":
        parts = parts[:-1]
        return ".".join(["embnum", *parts]), ".".join(["embnum", *parts])
    return ".".join(["embnum", *parts]), ".".join(["embnum", *parts[:-1]])


_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^\n]*)", re.M)


@functools.cache
def _imports(path: str, mtime: float, size: int) -> tuple[str, ...]:
    """The embnum modules (not packages) that the file at ``path`` imports, anywhere in it (its
    import statements read by pattern, not parsed: a kernel's first call from the cache pays for
    this; an import line inside a docstring only widens the key)."""
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"#[^\n]*", "", f.read())
    package = _module_name(path)[1].split(".")
    found = set()
    for dots, module, names in _FROM.findall(text):
        base = package[: len(package) - len(dots) + 1] if dots else []
        target = ".".join(base + ([module] if module else []))
        found.add(target)
        found.update(f"{target}.{n.split()[0]}" for n in names.strip("()").split(",") if n.strip())
    for names in _IMPORT.findall(text):
        found.update(n.split()[0] for n in names.split(",") if n.strip())
    return tuple(sorted(m for m in found if m.split(".")[0] == "embnum" and _module_path(m)))


@functools.cache
def _file_hash(path: str, mtime: float, size: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def source_stamp(path: str) -> tuple[tuple[str, str], ...]:
    """``(module, sha256 of its source)`` for the embnum module at ``path`` and every embnum module
    it imports, transitively: what a kernel defined there may have compiled into itself."""
    start = _module_name(path)[0]
    todo, seen = [start], {start: os.path.abspath(path)}
    while todo:
        p = seen[todo.pop()]
        st = os.stat(p)
        for m in _imports(p, st.st_mtime, st.st_size):
            if m not in seen:
                seen[m] = _module_path(m)
                todo.append(m)
    stamp = []
    for m, p in sorted(seen.items()):
        st = os.stat(p)
        stamp.append((m, _file_hash(p, st.st_mtime, st.st_size)))
    return tuple(stamp)


class _SafeIndex:
    """Numba's ``IndexDataCacheFile`` made safe for concurrent processes (see the module's
    docstring); mixed into the CPU and the CUDA one. The stamp is computed on first use."""

    _stamp = None
    _stamp_of: str = ""
    _compiler: tuple = ()  # what else the machine code depends on (numba-cuda's version for CUDA)

    @property
    def _source_stamp(self):
        if self._stamp is None:
            self._stamp = ("embnum", source_stamp(self._stamp_of), self._compiler)
        return self._stamp

    @_source_stamp.setter
    def _source_stamp(self, value):
        self._stamp = value

    def _entry_name(self, key) -> str:
        digest = hashlib.sha256(repr((key, self._source_stamp)).encode()).hexdigest()[:24]
        return self._data_name_pattern.replace("{number:d}", digest)

    @contextlib.contextmanager
    def _locked(self):
        if fcntl is None:
            yield
            return
        fd = os.open(self._index_path + ".lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def save(self, key, data):
        name = self._entry_name(key)
        self._save_data(name, (repr(key), data))  # whole before the index names it
        with self._locked():
            overloads = self._load_index()
            if not overloads:
                self._drop_stale_data()
            overloads[key] = name
            self._save_index(overloads)

    def _drop_stale_data(self):
        """Remove this kernel's data files that an index of other sources named: the files older
        than that index (a numbered name was reused by Numba; a hashed one would stay for ever).
        A file written since, by a process about to name it, is newer and kept."""
        try:
            stale = os.stat(self._index_path).st_mtime
        except FileNotFoundError:
            return
        head, tail = self._data_name_pattern.split("{number:d}")
        for entry in os.scandir(self._cache_path):
            if entry.name.startswith(head) and entry.name.endswith(tail):
                with contextlib.suppress(OSError):
                    if entry.stat().st_mtime < stale:
                        os.unlink(entry.path)

    def load(self, key):
        name = self._load_index().get(key)
        if name is None:
            return None
        try:
            stored = self._load_data(name)
        except (OSError, EOFError, ValueError, pickle.UnpicklingError):
            return None
        if not (isinstance(stored, tuple) and len(stored) == 2 and stored[0] == repr(key)):
            return None
        return stored[1]

    def flush(self):
        with self._locked():
            self._save_index({})


def _cell_value(x):
    """A closure cell's value as the cache key sees it: a Numba dispatcher as its function's module,
    name, bytecode, own closure and options; anything else as it is."""
    f = getattr(x, "py_func", None)
    if f is None or not hasattr(x, "targetoptions"):
        return x
    options = repr(sorted(x.targetoptions.items()))
    return ("dispatcher", f.__module__, f.__qualname__, f.__code__.co_code, closure_cells(f), options)


def closure_cells(fn) -> tuple:
    """What ``fn``'s closure holds, the same in every process (:func:`_cell_value` per cell)."""
    return tuple(_cell_value(c.cell_contents) for c in fn.__closure__ or ())


def _safe_cache(cache_class, index_class, compiler=()):
    """``cache_class`` (a Numba ``Cache``) whose index file is ``index_class`` made safe."""
    safe_index = type("Safe" + index_class.__name__, (_SafeIndex, index_class), {"_compiler": compiler})

    class SafeCache(cache_class):
        index_class = safe_index

        def _index_key(self, sig, codegen):
            """Numba's key, with the closure's hash taken over :func:`closure_cells`: Numba pickles
            a dispatcher with an id drawn anew in each process, so a kernel closing over one (the
            optimizer rule a factory picked) missed the cache in every new process."""
            key = super()._index_key(sig, codegen)
            if self._py_func.__closure__ is None:
                return key
            from numba.core.serialize import dumps

            *head, (code, _) = key
            return (*head, (code, hashlib.sha256(dumps(closure_cells(self._py_func))).hexdigest()))

        def __init__(self, py_func):
            super().__init__(py_func)
            old = self._cache_file
            self._cache_file = safe_index(self._cache_path, self._impl.filename_base, None)
            self._cache_file._stamp_of = self._impl.locator._py_file
            assert old._index_path == self._cache_file._index_path

    SafeCache.__name__ = SafeCache.__qualname__ = "Safe" + cache_class.__name__
    return SafeCache


class _PrebuiltLoad:
    """Mixed into the CPU cache: a signature missing from the process's own cache is looked up
    among the kernels compiled ahead for the baseline CPU (``embnum._prebuilt``), where this host
    can run them; their index key is the host's with the baseline's CPU name and features."""

    _prebuilt_index = None

    def _load_overload(self, sig, target_context):
        data = super()._load_overload(sig, target_context)
        if data is not None or not self._enabled:
            return data
        from . import _prebuilt

        if self._prebuilt_index is None:
            where = _prebuilt.directory_of(self._cache_file._stamp_of)
            if where is None:
                return None
            self._prebuilt_index = type(self._cache_file)(where, self._impl.filename_base, None)
            self._prebuilt_index._stamp_of = self._cache_file._stamp_of
        key = self._index_key(sig, target_context.codegen())
        stored = self._prebuilt_index.load((key[0], _prebuilt.magic(key[1]), *key[2:]))
        if stored is None:
            return None
        try:
            return self._impl.rebuild(target_context, stored)
        except Exception:  # noqa: BLE001 - a shipped file this Numba cannot rebuild: compile instead
            return None


@functools.cache
def _cpu_cache():
    from numba.core.caching import FunctionCache, IndexDataCacheFile

    safe = _safe_cache(FunctionCache, IndexDataCacheFile)
    return type(safe.__name__, (_PrebuiltLoad, safe), {})


@functools.cache
def _cuda_cache():
    from importlib import metadata

    from numba.cuda.core.caching import IndexDataCacheFile
    from numba.cuda.dispatcher import CUDACache

    # Numba's index records Numba's version only; the CUDA kernels are numba-cuda's compilation
    try:
        compiler = ("numba-cuda", metadata.version("numba-cuda"))
    except metadata.PackageNotFoundError:  # installed without its metadata
        compiler = ("numba-cuda", "unknown")
    return _safe_cache(CUDACache, IndexDataCacheFile, compiler)


def _enable(disp, cache_class):
    if hasattr(disp, "enable_caching"):  # not under NUMBA_DISABLE_JIT or the CUDA simulator
        disp._cache = cache_class()(disp.py_func)  # what enable_caching does, with our class
    return disp


def njit(*args, **options):
    """``numba.njit`` (same options); ``cache=True`` caches with :class:`_SafeIndex`."""
    import numba

    cache = options.pop("cache", False)

    def decorate(fn):
        disp = numba.njit(**options)(fn)
        return _enable(disp, _cpu_cache) if cache else disp

    return decorate(args[0]) if args else decorate


def cuda_kernel(fn=None, *, launch_bounds=None):
    """``numba.cuda.jit(cache=True)(fn)``, caching with :class:`_SafeIndex`. ``launch_bounds``
    ``(threads per block, blocks per SM)``: the most threads a launch may have and the blocks that
    must fit on one SM, so ptxas caps the registers to fit them (``(256, 4)``: 64); the simulator
    has no registers and ignores it. Use as ``@cuda_kernel`` or ``@cuda_kernel(launch_bounds=...)``."""
    from numba import cuda
    from numba.core import config

    def decorate(f):
        if launch_bounds is None or config.ENABLE_CUDASIM:
            return _enable(cuda.jit(f), _cuda_cache)
        return _enable(cuda.jit(launch_bounds=launch_bounds)(f), _cuda_cache)

    return decorate if fn is None else decorate(fn)
