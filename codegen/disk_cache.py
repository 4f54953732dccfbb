"""The persistent kernel cache: compiled objects on disk, shared by every process.

Two kinds of entries live in one directory:

- ``obj-<key>``: the machine code LLVM made for a module, keyed by the module's text, the
  target triple, CPU and features, LLVM's version and te_grad's own code: a process that
  builds the same module again loads the object instead of optimizing and compiling. A
  kernel's module is compiled in parts, a stage function each (:func:`codegen.jit.split_module`),
  so the entries are per stage: a kernel or model sharing a stage with an earlier one loads it;
- ``build-<key>``: a whole ``tg.build`` (the simplified graph, its stages and the key of
  its object, as JSON: :mod:`.build_codec`), keyed by the exact structure of the graph
  given to ``build`` (see :mod:`te_grad.fingerprint`) and the build options: a second
  process skips simplification and scheduling too.

An entry is a fixed header (:data:`MAGIC`, the format version, the lengths of the two
parts), JSON metadata (the entry's own kind and key, te_grad's version and the hash of its
code, and for a build the build itself), raw bytes (an object file) and the sha256 of all
that precedes it. Nothing in an entry is executed or unpickled: an entry is trusted only
when its checksum, format, kind, key and versions all match what the reader asked for, so
a truncated or damaged file, an entry renamed or copied under another key, an entry of the
other kind, or a file of another program is ignored, removed and rebuilt (never a wrong
kernel, never a crash). Object bytes are also checked to be an object file of the host's
format before LLVM sees them (see :func:`plausible_object`).

Where: the compile options' ``cache_dir`` (``TE_GRAD_CACHE_DIR``), else
``$XDG_CACHE_HOME/te_grad``, else ``~/.cache/te_grad``; ``disk_cache=False``
(``TE_GRAD_CACHE=0``) turns it off (see :mod:`codegen.options`). Safe with concurrent processes (an entry is written to a
temporary file and renamed into place, atomically); a directory that cannot be written is
no error (nothing is cached).
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import tempfile
from typing import Optional, Tuple

MAGIC = b"TGCACHE\0"
FORMAT = 2
_HEADER = struct.Struct("<8sIQQ")  # magic, format version, metadata length, data length
_DIGEST = 32


def enabled() -> bool:
    """``disk_cache`` of the compile options in force."""
    from .options import current_options
    return current_options().disk_cache


def directory() -> str:
    """The cache's directory: the compile options' ``cache_dir``, else the standard place."""
    from .options import current_options
    return current_options().resolved_cache_dir()


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


def te_grad_version() -> str:
    from te_grad.version import __version__
    return __version__


def _path(kind: str, k: str) -> str:
    return os.path.join(directory(), f"{kind}-{k}")


def encode_entry(kind: str, k: str, meta: dict, data: bytes = b"") -> bytes:
    """The bytes of an entry (see the module docstring)."""
    head = dict(meta, kind=kind, key=k, te_grad=te_grad_version(), code=code_version())
    text = json.dumps(head, separators=(",", ":"), allow_nan=False).encode()
    body = _HEADER.pack(MAGIC, FORMAT, len(text), len(data)) + text + data
    return body + hashlib.sha256(body).digest()


def decode_entry(kind: str, k: str, blob: bytes) -> Optional[Tuple[dict, bytes]]:
    """``(metadata, data)`` of an entry that passes every check for ``kind``/``k``, else None."""
    if len(blob) < _HEADER.size + _DIGEST:
        return None
    magic, version, meta_len, data_len = _HEADER.unpack_from(blob)
    if magic != MAGIC or version != FORMAT or _HEADER.size + meta_len + data_len + _DIGEST != len(blob):
        return None
    body = blob[:-_DIGEST]
    if hashlib.sha256(body).digest() != blob[-_DIGEST:]:
        return None
    try:
        meta = json.loads(body[_HEADER.size:_HEADER.size + meta_len])
    except ValueError:  # not UTF-8 or not JSON
        return None
    if not isinstance(meta, dict) or (meta.get("kind"), meta.get("key"), meta.get("te_grad"), meta.get("code")) != (
            kind, k, te_grad_version(), code_version()):
        return None  # an entry of another kind, key or version: never trusted
    return meta, body[_HEADER.size + meta_len:]


def load_entry(kind: str, k: str) -> Optional[Tuple[dict, bytes]]:
    """``(metadata, data)`` stored under ``kind``/``k``, or None (missing, or failing a check:
    such a file is removed, and the next store writes a good one)."""
    if not enabled():
        return None
    path = _path(kind, k)
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError:
        return None
    entry = decode_entry(kind, k, blob)
    if entry is None:
        discard(kind, k)
    return entry


def discard(kind: str, k: str):
    """Remove the entry ``kind``/``k`` (it failed a check); no error if that cannot be done."""
    try:
        os.unlink(_path(kind, k))
    except OSError:
        pass


def store_entry(kind: str, k: str, meta: dict, data: bytes = b"") -> bool:
    """Write an entry under ``kind``/``k`` (atomically); False if the directory cannot be written
    or ``meta`` is not JSON-safe."""
    if not enabled():
        return False
    try:
        blob = encode_entry(kind, k, meta, data)
    except (TypeError, ValueError):
        return False
    folder = directory()
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


def plausible_object(data: bytes) -> bool:
    """Whether ``data`` starts as an object file of the host's format does (ELF on Linux and
    the BSDs, Mach-O on macOS, COFF on Windows), for the host's word size."""
    wide = sys.maxsize > 2 ** 32
    if sys.platform == "darwin":
        return data[:4] in ((b"\xcf\xfa\xed\xfe",) if wide else (b"\xce\xfa\xed\xfe",))
    if sys.platform == "win32":
        return len(data) >= 20 and data[:2] in (b"\x64\x86", b"\x64\xaa", b"\x4c\x01", b"\xc4\x01")
    return len(data) >= 64 and data[:4] == b"\x7fELF" and data[4] == (2 if wide else 1) \
        and data[5] == (1 if sys.byteorder == "little" else 2) and data[16:18] in (b"\x01\x00", b"\x00\x01")


def load(kind: str, k: str) -> Optional[bytes]:
    """The raw bytes stored under ``kind``/``k`` by :func:`store`, or None."""
    entry = load_entry(kind, k)
    return None if entry is None else entry[1]


def store(kind: str, k: str, data: bytes) -> bool:
    """Write raw bytes under ``kind``/``k`` (atomically); False if the directory cannot be written."""
    return store_entry(kind, k, {}, data)


def load_object(k: str) -> Optional[bytes]:
    """The object file of module ``k``, or None (missing, failing a check, or not an object file)."""
    entry = load_entry("obj", k)
    if entry is None:
        return None
    if not plausible_object(entry[1]):
        discard("obj", k)
        return None
    return entry[1]


def store_object(k: str, data: bytes) -> bool:
    return store_entry("obj", k, {}, data)


def load_json(kind: str, k: str):
    """The JSON value stored under ``kind``/``k`` by :func:`store_json`, or None."""
    entry = load_entry(kind, k)
    return None if entry is None else entry[0].get("value")


def store_json(kind: str, k: str, value) -> bool:
    return store_entry(kind, k, {"value": value})
