"""The persistent kernel cache: compiled objects on disk, shared by every process.

Two kinds of entries live in one directory:

- ``obj-<key>``: the machine code LLVM made for a module, keyed by the module's text, the
  target triple, CPU and features, LLVM's version and te_grad's own code: a process that
  builds the same module again loads the object instead of optimizing and compiling;
- ``build-<key>``: a whole ``tg.build`` (the simplified graph, its stages and the key of
  its object), keyed by the exact structure of the graph given to ``build`` (see
  :mod:`te_grad.fingerprint`) and the build options: a second process skips
  simplification and scheduling too.

Where: ``TE_GRAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/te_grad``, else ``~/.cache/te_grad``;
``TE_GRAD_CACHE=0`` turns it off. Safe with concurrent processes (an entry is written to a
temporary file and renamed into place, atomically); an entry that does not read back
(truncated, corrupt, from another version) is ignored and rebuilt; a directory that cannot
be written is no error (nothing is cached).
"""
from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import zlib
from typing import Optional

_MAGIC = b"te_grad-cache-1\n"


def enabled() -> bool:
    return os.environ.get("TE_GRAD_CACHE", "1") not in ("0", "", "false", "no")


def directory() -> str:
    explicit = os.environ.get("TE_GRAD_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "te_grad")


_CODE = None


def code_version() -> str:
    """A hash of te_grad's own source (the te_grad, simplify and codegen packages): an entry
    made by other code is never used."""
    global _CODE
    if _CODE is None:
        h = hashlib.sha256()
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        for package in ("te_grad", "simplify", "codegen"):
            for folder, _, files in sorted(os.walk(os.path.join(root, package))):
                for name in sorted(files):
                    if name.endswith(".py"):
                        with open(os.path.join(folder, name), "rb") as f:
                            h.update(name.encode())
                            h.update(f.read())
        _CODE = h.hexdigest()
    return _CODE


def key(*parts: str) -> str:
    from .llvm import binding
    h = hashlib.sha256()
    for part in (code_version(), ".".join(map(str, binding.llvm_version_info)), *parts):
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def load(kind: str, k: str) -> Optional[bytes]:
    """The payload stored under ``kind``/``k``, or None (missing, unreadable or corrupt)."""
    if not enabled():
        return None
    path = os.path.join(directory(), f"{kind}-{k}")
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError:
        return None
    if not blob.startswith(_MAGIC) or len(blob) < len(_MAGIC) + 32:
        return None
    digest, payload = blob[len(_MAGIC):len(_MAGIC) + 32], blob[len(_MAGIC) + 32:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    try:
        return zlib.decompress(payload)
    except zlib.error:
        return None


def store(kind: str, k: str, data: bytes) -> bool:
    """Write ``data`` under ``kind``/``k`` (atomically); False if the directory cannot be written."""
    if not enabled():
        return False
    folder = directory()
    payload = zlib.compress(data, 1)
    blob = _MAGIC + hashlib.sha256(payload).digest() + payload
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{kind}-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, os.path.join(folder, f"{kind}-{k}"))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError:
        return False
    return True


def load_object(k: str) -> Optional[bytes]:
    return load("obj", k)


def store_object(k: str, data: bytes) -> bool:
    return store("obj", k, data)


def load_pickle(kind: str, k: str):
    data = load(kind, k)
    if data is None:
        return None
    try:
        return pickle.loads(data)
    except Exception:  # noqa: BLE001 - an entry from another version, or damaged: rebuild
        return None


def store_pickle(kind: str, k: str, value) -> bool:
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except (RecursionError, pickle.PicklingError, TypeError, AttributeError):
        return False  # a graph too deep or holding something unpicklable: not cached
    return store(kind, k, data)
