"""The one place codegen takes llvmlite from: its IR builder and its LLVM binding.

Every other codegen module uses ``from .llvm import ir`` (building IR text) or
``from .llvm import binding`` (parsing, optimizing, JIT-compiling).
"""
import llvmlite.binding as binding
import llvmlite.ir as ir

__all__ = ["ir", "binding"]
