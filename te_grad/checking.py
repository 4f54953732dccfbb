"""Whether the IR verifier (:mod:`te_grad.verify`) runs between the stages.

The compile options in force say (``CompileOptions.verify``, set for a ``with
codegen.options.compile_options(verify=...)`` block or a build by :data:`checking`);
outside them ``TE_GRAD_VERIFY`` does (:func:`environment_default`, the variable's one
reader, also the default of ``CompileOptions.from_env``). A module of its own, importing
nothing, so that the compiler's options can set the switch without depending on the IR.
"""
from __future__ import annotations

import contextvars
import os
from typing import Optional

#: verification on or off as the compile options in force say; None outside them
checking: "contextvars.ContextVar[Optional[bool]]" = contextvars.ContextVar("te_grad_verify", default=None)


def verify_flag(value: Optional[str]) -> bool:
    """What a value of ``TE_GRAD_VERIFY`` says: on when set and not ``0``."""
    return (value or "") not in ("", "0")


def environment_default() -> bool:
    """``TE_GRAD_VERIFY`` set (and not ``0``)."""
    return verify_flag(os.environ.get("TE_GRAD_VERIFY"))


def enabled() -> bool:
    """True when the compile options in force (else ``TE_GRAD_VERIFY``) ask for verification."""
    flag = checking.get()
    return environment_default() if flag is None else flag
