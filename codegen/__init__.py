"""Scheduling, LLVM lowering and JIT compilation of te_grad graphs."""
