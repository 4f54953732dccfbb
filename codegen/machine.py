"""What the schedule needs to know about the machine, as data.

:class:`Machine` holds the few numbers the scheduling transformations size
themselves by: the widest vector register, how many vector registers there are,
and the per-core cache sizes. :func:`host_machine` reads them once from LLVM's
host CPU features and from Linux's ``/sys`` cache description (with portable
defaults where a number cannot be read). Schedules depend only on these values,
never on the CPU's name, so that a test can schedule for any machine by passing
one.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Machine:
    #: bits of the widest vector register the kernels may use (128: SSE/NEON, 256: AVX2, 512: AVX-512)
    vector_bits: int = 256
    #: vector registers of that width
    vector_registers: int = 16
    #: bytes of the first-level data cache of one core
    l1_bytes: int = 32 * 1024
    #: bytes of the second-level cache of one core
    l2_bytes: int = 1024 * 1024

    def lanes(self, dtype: str) -> int:
        """Elements of ``dtype`` in one vector register."""
        return self.vector_bits // (32 if dtype in ("float32", "int32") else 64)


#: what schedules assume when the host cannot be described (an AVX2 core with a 1 MiB L2)
PORTABLE = Machine()


def _sys_cache_bytes(level: int, root: str = "/sys/devices/system/cpu/cpu0/cache") -> "int | None":
    """The size of core 0's data or unified cache of ``level`` as Linux reports it, or None."""
    try:
        for entry in sorted(os.listdir(root)):
            path = os.path.join(root, entry)
            with open(os.path.join(path, "level")) as f:
                if int(f.read()) != level:
                    continue
            with open(os.path.join(path, "type")) as f:
                if f.read().strip() not in ("Data", "Unified"):
                    continue
            with open(os.path.join(path, "size")) as f:
                text = f.read().strip().upper()
            scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
            return int(text.rstrip("KM")) * scale
    except (OSError, ValueError):
        return None
    return None


@functools.lru_cache(maxsize=1)
def host_machine() -> Machine:
    """This machine, from LLVM's host features and the cache sizes Linux reports."""
    from .llvm import binding as llvm
    try:
        features = llvm.get_host_cpu_features()
        has = {name for name, on in features.items() if on}
    except RuntimeError:  # LLVM cannot read the host's features
        has = set()
    if "avx512f" in has:
        bits, registers = 512, 32
    elif "avx2" in has or "avx" in has:
        bits, registers = 256, 16
    elif "neon" in has or "sse2" in has:
        bits, registers = 128, 32 if "neon" in has else 16
    else:
        bits, registers = PORTABLE.vector_bits, PORTABLE.vector_registers
    return Machine(vector_bits=bits, vector_registers=registers,
                   l1_bytes=_sys_cache_bytes(1) or PORTABLE.l1_bytes,
                   l2_bytes=_sys_cache_bytes(2) or PORTABLE.l2_bytes)
