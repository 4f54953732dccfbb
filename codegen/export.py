"""Kernels as object files with a C header, for the host or another CPU (``Kernel.export``).

An exported kernel needs nothing at run time beyond the C library and libm (and
pthreads for a threaded build). Its calling convention, written into the header:

- one entry point per kernel, named after the file (``out/conv_grad`` -> ``conv_grad``),
  ``int conv_grad(const float *X, const float *W, const float *dY, float *Y, float *dX,
  float *dW)``: pointers to the inputs in the kernel's input order, then to the outputs in
  its output order; every buffer contiguous, row-major, of the shape and dtype the header
  states (a ``#define`` per dimension, one per element count), outputs distinct from
  inputs and from each other;
- 0-d inputs listed as scalars are passed by value instead (``float lr``);
- a kernel whose shapes use size variables (``tg.var``) takes their values first, as
  ``int64_t`` arguments in the order of ``kernel.size_vars`` (``int f(int64_t n, const
  float *X, float *Y)``); the buffers have the shapes those sizes give. A size outside its
  variable's range, or one that makes an extent negative, returns ``5`` (the buffers are
  not touched);
- a group packs several buffers in one blob at stated byte offsets (a model's state);
- the return value is ``0``, or an error code: ``1`` an index out of range, computed from
  data or read under a condition on data (the bad index is never read), ``2`` an integer
  division by zero, ``3`` no memory for the intermediates (``malloc``), ``4`` a ragged loop
  (bounds read from data, a CSR row pointer) that would run backwards, ``5`` sizes out of
  range; ``NAME_ex`` takes a last ``int64_t info[4]`` receiving (buffer, dimension, value,
  stage) of the error ((lo, hi, loop, stage) for ``4``);
- intermediates live in one ``malloc`` per call, freed before returning; with
  ``threads > 1`` the parallel regions of the kernel run on that many pthreads.

Targets: ``"host"`` (this machine: its CPU and features), ``"aarch64-linux-gnu"``,
``"armv7-linux-gnueabihf"`` (32-bit ARM, NEON), ``"riscv64-linux-gnu"``, or any LLVM
triple; ``cpu=`` and ``features=`` override the portable defaults.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import textwrap
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from te_grad.errors import UserError
from te_grad.ir import Tensor

from .compile_worker import SLP_LANE_OPS, lane_ops
from .llvm import binding as llvm
from .llvm import ir
from .llvm_module import RUN_STAGES, emit_module
from .llvm_types import I8, I32, I64, MEMORY

#: portable defaults of the named targets: (LLVM triple, CPU, features, C compiler)
TARGETS = {
    "aarch64-linux-gnu": ("aarch64-unknown-linux-gnu", "generic", "+neon", "aarch64-linux-gnu-gcc"),
    "armv7-linux-gnueabihf": ("armv7-unknown-linux-gnueabihf", "generic", "+neon,+vfp3,+thumb2",
                              "arm-linux-gnueabihf-gcc"),
    "riscv64-linux-gnu": ("riscv64-unknown-linux-gnu", "generic-rv64", "+m,+a,+f,+d,+c", "riscv64-linux-gnu-gcc"),
}
ERRORS = {0: "OK", 1: "ERROR_INDEX", 2: "ERROR_DIVISION", 3: "ERROR_MEMORY", 4: "ERROR_RAGGED",
          5: "ERROR_SIZE"}
C_TYPES = {"float32": "float", "float64": "double", "int32": "int32_t", "int64": "int64_t", "bool": "uint8_t"}
_WHOLE = 1 << 62


@dataclass
class Arg:
    """One argument of an entry point: a buffer (``tensor``), a scalar (a 0-d input passed by
    value), or a group (``members``: tensors at byte offsets of one blob)."""
    name: str
    kind: str                               # "buffer", "scalar", "group" or "size"
    tensor: Optional[Tensor] = None
    output: bool = False
    members: List[Tuple[Tensor, int]] = field(default_factory=list)
    size: int = 0                           # a group's bytes
    doc: str = ""                           # what the argument means, written into the header
    size_var: object = None                 # a "size" argument's variable (te_grad.ir.SizeVar)


@dataclass
class Entry:
    """An entry point: ``kernel`` called with ``args``."""
    name: str
    kernel: object
    args: List[Arg]
    doc: str = ""


#: keywords of C89, C99, C11 and C23 (the header is C), and of C++ (it is also C++: extern "C")
C_KEYWORDS = frozenset("""
    auto break case char const continue default do double else enum extern float for goto if int long
    register return short signed sizeof static struct switch typedef union unsigned void volatile while
    inline restrict _Bool _Complex _Imaginary
    _Alignas _Alignof _Atomic _Generic _Noreturn _Static_assert _Thread_local
    alignas alignof bool constexpr false nullptr static_assert thread_local true typeof typeof_unqual
    _BitInt _Decimal32 _Decimal64 _Decimal128
    and and_eq asm bitand bitor catch char8_t char16_t char32_t class co_await co_return co_yield compl
    concept const_cast consteval constinit decltype delete dynamic_cast explicit export friend mutable
    namespace new noexcept not not_eq operator or or_eq private protected public reinterpret_cast
    requires static_cast template this throw try typeid typename using virtual wchar_t xor xor_eq
""".split())
#: functions the exported object itself calls or defines besides the entry points, or that
#: LLVM may call for it (memset, memcpy, libm's functions): an entry point of that name
#: would stand in for them
_MATH = """acos asin atan atan2 cos sin tan acosh asinh atanh cosh sinh tanh exp exp2 expm1 frexp ldexp
    log log10 log1p log2 logb modf scalbn cbrt fabs hypot pow sqrt erf erfc lgamma tgamma ceil floor
    nearbyint rint lrint llrint round lround llround trunc fmod remainder remquo copysign nan nextafter
    fdim fmax fmin fma sincos""".split()
OBJECT_SYMBOLS = frozenset({"malloc", "calloc", "realloc", "free", "abort", "memset", "memcpy", "memmove",
                            "memcmp", "pthread_create", "pthread_join", "te_grad_join"}
                           | {f + suffix for f in _MATH for suffix in ("", "f", "l")})
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: names <stdint.h> (which the header includes) declares or defines
_STDINT = re.compile(r"u?int(_least|_fast)?\d+_t|u?int(max|ptr)_t|U?INT(_LEAST|_FAST)?\d+_(MAX|MIN|C)"
                     r"|U?INT(MAX|PTR)_(MAX|MIN|C)|(PTRDIFF|SIG_ATOMIC|SIZE|WCHAR|WINT)_(MAX|MIN)|NULL\Z")


def c_identifier_problem(name: str) -> Optional[str]:
    """Why ``name`` cannot be declared by the header (``None`` if it can): not a C identifier,
    a C or C++ keyword, an identifier reserved to the implementation (``__`` anywhere, ``_``
    then a capital), or a name of ``<stdint.h>``."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        return "not a C identifier (letters, digits and _, not starting with a digit)"
    if name in C_KEYWORDS:
        return "a C keyword"
    if "__" in name or re.match(r"_[A-Z]", name):
        return "reserved to the C implementation (a double underscore, or _ then a capital)"
    if _STDINT.fullmatch(name):
        return "a name <stdint.h> declares"
    return None


def check_names(entries: Sequence["Entry"], base: str, spec: "TargetSpec", constants: Dict[str, np.ndarray],
                object_symbols=frozenset()) -> None:
    """A :class:`UserError` unless every entry point (and its ``_ex`` variant) and every constant
    is a name the header can declare, distinct from each other, from the macros the header
    defines and from the functions the object calls (``object_symbols``: ``malloc``, libm's).
    Arguments whose names C would refuse (``int``, a macro's name) are renamed in place
    (``int_arg``): their names only document the prototype."""
    declared: Dict[str, str] = {}
    for what, name in ([("entry point", e.name) for e in entries]
                       + [("constant", c) for c in constants]):
        problem = c_identifier_problem(name)
        if problem is None and name.startswith("_"):
            problem = "reserved to the C implementation (a name at file scope starting with _)"
        if problem is not None:
            where = " (Kernel.export(..., name=...) or the file's name)" if what == "entry point" else ""
            raise UserError(f"export: {what} name {name!r} is {problem}; choose another name{where}")
        for decl in ([name, name + "_ex"] if what == "entry point" else [name]):
            if decl in declared:
                raise UserError(f"export: {what} name {name!r} declares {decl}, as does {declared[decl]}")
            if decl in object_symbols or decl in OBJECT_SYMBOLS:
                raise UserError(f"export: {what} name {name!r} is a function the exported object calls "
                                f"({decl}); choose another name")
            declared[decl] = f"{what} name {name!r}"
    for e in entries:
        _rename_args(e, set())
    macros = set(re.findall(r"^#define (\w+)", header(entries, base, spec, 1, constants), re.M))
    for decl, owner in declared.items():
        if decl in macros:
            raise UserError(f"export: {owner} declares {decl}, a macro the header defines; choose another name")
    for e in entries:
        _rename_args(e, macros)


def _rename_args(e: "Entry", macros) -> None:
    used = set()
    for a in e.args:
        name = a.name
        if c_identifier_problem(name) is not None or name in macros:
            fixed = re.sub(r"_+", "_", c_name(name)).strip("_") or "arg"
            name = fixed if c_identifier_problem(fixed) is None and fixed not in macros else fixed + "_arg"
        base_name, k = name, 1
        while name in used:
            name, k = f"{base_name}_{k}", k + 1
        used.add(name)
        a.name = name


def c_name(name: str) -> str:
    out = re.sub(r"[^0-9a-zA-Z_]", "_", name)
    return out if out and not out[0].isdigit() else "_" + out


def entry_for(kernel, name: str, scalars: Sequence[Tensor] = ()) -> Entry:
    """The plain entry point of ``kernel``: its sizes (``int64_t``, in the order of
    ``kernel.size_vars``), inputs (scalars by value), then outputs."""
    seen = {id(t) for t in kernel.inputs}
    for t in kernel.outputs:  # each output its own buffer, which the entry point writes
        if id(t) in seen:
            raise UserError(f"export: {t.name} is {'an input' if any(t is i for i in kernel.inputs) else 'given twice'}"
                            " among the kernel's outputs; export a copy of it (a tensor computed from it)")
        seen.add(id(t))
    used, args = set(), []
    for v in getattr(kernel, "size_vars", ()):
        used.add(c_name(v.name))
        args.append(Arg(c_name(v.name), "size", size_var=v))
    for t, out in [(t, False) for t in kernel.inputs] + [(t, True) for t in kernel.outputs]:
        base = c_name(t.name)
        arg_name, k = base, 1
        while arg_name in used:
            arg_name, k = f"{base}_{k}", k + 1
        used.add(arg_name)
        scalar = not out and any(t is s for s in scalars)
        if scalar and t.shape != ():
            raise UserError(f"export: scalar argument {t.name} must be 0-d, it has shape {list(t.shape)}")
        args.append(Arg(arg_name, "scalar" if scalar else "buffer", t, out))
    return Entry(name, kernel, args)


def group(name: str, tensors: Sequence[Tensor], output: bool, align: int = 16) -> Arg:
    """A group argument packing ``tensors`` one after the other, each aligned to ``align`` bytes."""
    members, offset = [], 0
    for t in tensors:
        offset = -(-offset // align) * align
        members.append((t, offset))
        offset += t.size * np.dtype(t.dtype).itemsize
    return Arg(name, "group", output=output, members=members, size=offset)


# -- targets ---------------------------------------------------------------------------------

@dataclass
class TargetSpec:
    triple: str
    cpu: str
    features: str
    compiler: Optional[str]


def target_spec(target: str, cpu: Optional[str], features: Optional[str]) -> TargetSpec:
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    if target == "host":
        spec = TargetSpec(llvm.get_process_triple(), llvm.get_host_cpu_name(),
                          llvm.get_host_cpu_features().flatten(), "cc")
    elif target in TARGETS:
        triple, c, f, comp = TARGETS[target]
        spec = TargetSpec(triple, c, f, comp)
    else:
        spec = TargetSpec(target, "generic", "", None)
    if cpu is not None:
        spec.cpu = cpu
    if features is not None:
        spec.features = features
    try:
        llvm.Target.from_triple(spec.triple)
    except RuntimeError as err:
        raise UserError(f"export: LLVM does not know the target {target!r} ({spec.triple}): {err}") from None
    return spec


def _machine(spec: TargetSpec):
    return llvm.Target.from_triple(spec.triple).create_target_machine(
        cpu=spec.cpu, features=spec.features, opt=3, reloc="pic", codemodel="default")


# -- the object --------------------------------------------------------------------------------

def export(entries: Sequence[Entry], path: str, target: str = "host", cpu: Optional[str] = None,
           features: Optional[str] = None, shared: bool = False, threads: int = 1,
           constants: Dict[str, np.ndarray] = None) -> Dict[str, str]:
    """Write ``path.o`` and ``path.h`` (and ``path.so`` when ``shared``) for ``entries``;
    ``constants`` become global ``const`` arrays of the object. Returns the file paths."""
    if not isinstance(threads, int) or threads < 1:
        raise UserError(f"export: threads must be a positive int, got {threads!r}")
    sized = [e.name for e in entries if getattr(e.kernel, "size_vars", ())]
    if sized and threads > 1:
        raise UserError(f"export: {', '.join(sized)} take sizes known only at run time; such kernels are "
                        "exported single-threaded (threads=1)")
    spec = target_spec(target, cpu, features)
    machine = _machine(spec)
    constants = constants or {}
    pointer_bits = 32 if re.search(r"-p:32", str(machine.target_data)) else 64
    modules, texts = [], []
    for e in entries:
        kernel = e.kernel
        stages = [cs.stage for cs in kernel.stages]
        text = emit_module(stages, kernel._index, getattr(kernel, "fast_math", True),
                           prefix=f"{e.name}__", internal=True,
                           bound_checks=getattr(kernel, "bound_checks", True),
                           sizes=getattr(kernel, "size_vars", ()))
        texts.append(text)
        modules.append(llvm.parse_assembly(text))
    check_names(entries, os.path.basename(path), spec, constants,
                {f.name for m in modules for f in m.functions if f.is_declaration})
    wrapper = _wrappers(entries, pointer_bits, threads, constants or {})
    main = llvm.parse_assembly(str(wrapper))
    for m in modules:
        main.link_in(m)
    main.triple = spec.triple
    main.data_layout = str(machine.target_data)
    main.verify()
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    tuning.loop_vectorization = True
    tuning.slp_vectorization = max(map(lane_ops, texts), default=0) <= SLP_LANE_OPS  # see compile_worker.optimize
    tuning.loop_unrolling = False
    builder = llvm.create_pass_builder(machine, tuning)
    builder.getModulePassManager().run(main, builder)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    out = {"object": path + ".o", "header": path + ".h"}
    with open(out["object"], "wb") as f:
        f.write(machine.emit_object(main))
    with open(out["header"], "w") as f:
        f.write(header(entries, os.path.basename(path), spec, threads, constants or {}))
    if shared:
        out["shared"] = _link_shared(out["object"], path + ".so", spec, threads)
    return out


def _link_shared(obj: str, so: str, spec: TargetSpec, threads: int) -> str:
    compiler = spec.compiler if spec.compiler and shutil.which(spec.compiler) else None
    if compiler is None:
        raise UserError(f"export(shared=True): no C compiler for {spec.triple} on this machine to link the "
                        "shared library (link the object yourself: cc -shared -o lib.so file.o -lm)")
    cmd = [compiler, "-shared", "-o", so, obj, "-lm"] + (["-lpthread"] if threads > 1 else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"export: linking {so} failed: {done.stderr.strip()}")
    return so


def _wrappers(entries: Sequence[Entry], pointer_bits: int, threads: int, constants) -> ir.Module:
    module = ir.Module(name="te_grad_export")
    size_t = ir.IntType(pointer_bits)
    i8p = ir.PointerType(I8)
    malloc = ir.Function(module, ir.FunctionType(i8p, [size_t]), "malloc")
    free = ir.Function(module, ir.FunctionType(ir.VoidType(), [i8p]), "free")
    for name, value in constants.items():
        value = np.ascontiguousarray(value)
        elem = {"float32": ir.FloatType(), "float64": ir.DoubleType(), "int64": I64, "int32": I32}[value.dtype.name]
        ty = ir.ArrayType(elem, value.size)
        g = ir.GlobalVariable(module, ty, name)
        g.global_constant = True
        g.initializer = ir.Constant(ty, [ir.Constant(elem, v.item()) for v in value.ravel()])
    for e in entries:
        _entry(module, e, malloc, free, size_t, threads)
    return module


def _param_type(a: Arg):
    if a.kind == "size":
        return I64
    if a.kind == "scalar":
        return MEMORY[a.tensor.dtype]
    if a.kind == "group":
        return ir.PointerType(I8)
    return ir.PointerType(MEMORY[a.tensor.dtype])


def _entry(module, e: Entry, malloc, free, size_t, threads: int):
    kernel = e.kernel
    i8p = ir.PointerType(I8)
    run = ir.Function(module, ir.FunctionType(I32, [ir.PointerType(i8p), I64, I64, I64, I64, ir.PointerType(I64)]),
                      f"{e.name}__{RUN_STAGES}")
    params = [_param_type(a) for a in e.args]
    for variant, with_info in ((e.name, False), (e.name + "_ex", True)):
        fn = ir.Function(module, ir.FunctionType(I32, params + ([ir.PointerType(I64)] if with_info else [])),
                         variant)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        n = len(kernel.buffers)
        size_vars = tuple(getattr(kernel, "size_vars", ()))
        table = b.alloca(ir.ArrayType(i8p, n + len(size_vars)), name="buffers")

        def slot(k):
            return b.gep(table, [ir.Constant(I32, 0), ir.Constant(I32, k)], inbounds=True)

        sizes = {id(a.size_var): value for a, value in zip(e.args, fn.args) if a.kind == "size"}
        if size_vars:
            info = fn.args[-1] if with_info else None
            _check_sizes(b, fn, kernel, size_vars, sizes, info)
            for k, v in enumerate(size_vars):  # after the buffer addresses, as the stages read them
                b.store(b.inttoptr(sizes[id(v)], i8p), slot(n + k))

        def extent(x):
            return ir.Constant(I64, x) if isinstance(x, int) else _size_value(b, x, sizes)

        for a, value in zip(e.args, fn.args):
            if a.kind == "size":
                continue
            if a.kind == "buffer":
                b.store(b.bitcast(value, i8p), slot(kernel._index[id(a.tensor)]))
            elif a.kind == "scalar":
                cell = b.alloca(MEMORY[a.tensor.dtype])
                b.store(value, cell)
                b.store(b.bitcast(cell, i8p), slot(kernel._index[id(a.tensor)]))
            else:
                for t, offset in a.members:
                    b.store(b.gep(value, [ir.Constant(I64, offset)], inbounds=True), slot(kernel._index[id(t)]))
        given = {id(t) for a in e.args for t in ([a.tensor] if a.tensor is not None else [m for m, _ in a.members])}
        scratch = [(k, t) for k, t in enumerate(kernel.buffers) if id(t) not in given]
        offsets, total = [], 0
        for k, t in scratch:
            item = np.dtype(t.dtype if t.dtype != "bool" else "int8").itemsize
            if isinstance(total, int) and all(isinstance(x, int) for x in t.shape):
                total = -(-total // 64) * 64
                offsets.append(total)
                total += max(1, t.size * item)
                continue
            # extents known at run time: the offsets computed from the sizes (i64)
            total = ir.Constant(I64, total) if isinstance(total, int) else total
            total = b.and_(b.add(total, ir.Constant(I64, 63)), ir.Constant(I64, -64))
            offsets.append(total)
            bytes_ = ir.Constant(I64, item)
            for x in t.shape:
                bytes_ = b.mul(bytes_, extent(x))
            bytes_ = b.select(b.icmp_signed("<", bytes_, ir.Constant(I64, 1)), ir.Constant(I64, 1), bytes_)
            total = b.add(total, bytes_)
        block = None
        if scratch:
            if isinstance(total, int):
                size = ir.Constant(size_t, total)
            else:
                size = total if size_t.width == 64 else b.trunc(total, size_t)
            block = b.call(malloc, [size])
            with b.if_then(b.icmp_unsigned("==", block, ir.Constant(i8p, None)), likely=False):
                b.ret(ir.Constant(I32, 3))
            for (k, _), off in zip(scratch, offsets):
                off = ir.Constant(I64, off) if isinstance(off, int) else off
                b.store(b.gep(block, [off], inbounds=True), slot(k))
        err = b.alloca(ir.ArrayType(I64, 4), name="err")
        err_p = b.gep(err, [ir.Constant(I32, 0), ir.Constant(I32, 0)], inbounds=True)
        table_p = b.gep(table, [ir.Constant(I32, 0), ir.Constant(I32, 0)], inbounds=True)
        rc = _run_all(module, b, e, run, table_p, err_p, threads, size_t.width)
        if block is not None:
            b.call(free, [block])
        if with_info:
            info = fn.args[-1]
            for k in range(4):
                b.store(b.load(b.gep(err, [ir.Constant(I32, 0), ir.Constant(I32, k)])),
                        b.gep(info, [ir.Constant(I64, k)]))
        b.ret(rc)


def _size_value(b, e, sizes):
    """The i64 value of size expression ``e`` (size variables: ``sizes[id(var)]``)."""
    from te_grad.ir import Binary, Cast, Const, SizeVar
    if isinstance(e, int):
        return ir.Constant(I64, e)
    if isinstance(e, SizeVar):
        return sizes[id(e)]
    if isinstance(e, Const):
        return ir.Constant(I64, int(e.value))
    if isinstance(e, Cast):
        return _size_value(b, e.a, sizes)
    if isinstance(e, Binary):
        x, y = _size_value(b, e.a, sizes), _size_value(b, e.b, sizes)
        if e.op == "add":
            return b.add(x, y)
        if e.op == "sub":
            return b.sub(x, y)
        if e.op == "mul":
            return b.mul(x, y)
        if e.op in ("min", "max"):
            return b.select(b.icmp_signed("<" if e.op == "min" else ">", x, y), x, y)
        if e.op in ("floordiv", "floormod") and isinstance(e.b, Const) and int(e.b.value) > 0:
            q = b.sdiv(x, y)
            r = b.srem(x, y)
            neg = b.icmp_signed("<", r, ir.Constant(I64, 0))
            if e.op == "floordiv":
                return b.sub(q, b.zext(neg, I64))
            return b.select(neg, b.add(r, y), r)
    raise UserError(f"export: the size {e} is not a size expression the entry point can compute")


def _check_sizes(b, fn, kernel, size_vars, sizes, info):
    """Return ``4`` (and fill ``info`` with (-1, variable number, value, -1)) when a size is
    outside its variable's range or makes an extent of a buffer negative."""
    from te_grad.sizes import size_vars_in
    position = {id(v): k for k, v in enumerate(size_vars)}

    def refuse(bad, k, value):
        with b.if_then(bad, likely=False):
            if info is not None:
                for j, x in enumerate((ir.Constant(I64, -1), ir.Constant(I64, k), value, ir.Constant(I64, -1))):
                    b.store(x, b.gep(info, [ir.Constant(I64, j)]))
            b.ret(ir.Constant(I32, 5))

    for k, v in enumerate(size_vars):
        x = sizes[id(v)]
        bad = b.icmp_signed("<", x, ir.Constant(I64, v.lo))
        if v.hi is not None:
            bad = b.or_(bad, b.icmp_signed(">", x, ir.Constant(I64, v.hi)))
        refuse(bad, k, x)
    seen = set()
    for t in kernel.buffers:
        for x in t.shape:
            if isinstance(x, int) or str(x) in seen:
                continue
            seen.add(str(x))
            value = _size_value(b, x, sizes)
            used = size_vars_in(x)
            refuse(b.icmp_signed("<", value, ir.Constant(I64, 0)), position[id(used[0])] if used else -1, value)


def _run_all(module, b, e: Entry, run, table_p, err_p, threads: int, pointer_bits: int):
    """Every stage in order: one call, or per parallel region a fork of ``threads`` pthreads."""
    kernel = e.kernel
    if threads == 1:
        return b.call(run, [table_p, ir.Constant(I64, 0), ir.Constant(I64, len(kernel.stages)),
                            ir.Constant(I64, 0), ir.Constant(I64, _WHOLE), err_p])
    from .export_threads import run_threaded
    return run_threaded(module, b, e, run, table_p, err_p, threads, pointer_bits)


# -- the header ----------------------------------------------------------------------------------

def header(entries: Sequence[Entry], base: str, spec: TargetSpec, threads: int, constants) -> str:
    from te_grad.version import __version__
    guard = c_name(base).upper() + "_H"
    lines = [f"/* {base}.h: generated by te_grad {__version__} for {spec.triple} (cpu {spec.cpu}).",
             " *",
             " * Calling convention: each function takes pointers to its inputs, in order, then to its",
             " * outputs; every buffer is contiguous and row-major, of the dtype and shape below; outputs",
             " * must not overlap inputs or each other. Scalars are passed by value, each described",
             " * at its function below; a group is one blob holding several buffers at the byte",
             " * offsets given below. Each function returns",
             f" * {base.upper()}_OK (0) or an error code; the _ex variant also fills info[4] with the",
             " * buffer, dimension, value and stage of the error. An out-of-range index is never read.",
             f" * Threads: {'single-threaded' if threads == 1 else f'{threads} pthreads per parallel region'}"
             "; intermediates: one malloc per call.",
             " * Link with -lm" + (" -lpthread." if threads > 1 else "."),
             " */",
             f"#ifndef {guard}", f"#define {guard}", "", "#include <stdint.h>", "",
             "#ifdef __cplusplus", 'extern "C" {', "#endif", ""]
    prefix = c_name(base).upper()
    for code, what in ERRORS.items():
        lines.append(f"#define {prefix}_{what} {code}")
    lines.append("")
    for name, value in constants.items():
        lines.append(f"/* {name}: {value.size} values */")
        lines.append(f"#define {c_name(name).upper()}_SIZE {value.size}")
        lines.append(f"extern const {C_TYPES[np.asarray(value).dtype.name]} {name}[{value.size}];")
        lines.append("")
    for e in entries:
        up = c_name(e.name).upper()
        if e.doc:
            lines += [f"/* {line} */" for line in e.doc.splitlines()]
        params = []
        for a in e.args:
            tag = f"{up}_{c_name(a.name).upper()}"
            if a.kind == "size":
                v = a.size_var
                rng = f">= {v.lo}" if v.hi is None else f"in [{v.lo}, {v.hi}]"
                lines.append(f"/* size {a.name}: the value of size variable {v.name}, {rng} (else "
                             f"{prefix}_ERROR_SIZE) */")
                params.append(f"int64_t {a.name}")
                continue
            if a.kind == "group":
                lines.append(f"/* {a.name}: a group of {len(a.members)} buffers, {a.size} bytes */")
                lines += [f"/*   {line} */" for line in textwrap.wrap(a.doc, 92)]
                lines.append(f"#define {tag}_BYTES {a.size}")
                for t, offset in a.members:
                    mtag = f"{tag}_{c_name(t.name).upper()}"
                    lines.append(f"#define {mtag}_OFFSET {offset}  /* {t.dtype}{list(t.shape)} */")
                    lines.append(f"#define {mtag}_SIZE {t.size}")
                params.append(f"{'' if a.output else 'const '}void *{a.name}")
                continue
            t = a.tensor
            role = "output" if a.output else ("scalar input" if a.kind == "scalar" else "input")
            what = f"{role} {a.name}: {t.dtype}{list(t.shape)}" + (", passed by value" if a.kind == "scalar" else "")
            if a.doc:
                lines.append(f"/* {what}:")
                lines += [f" *   {line}" for line in textwrap.wrap(a.doc, 92)]
                lines.append(" */")
            else:
                lines.append(f"/* {what} */")
            lines.append(f"#define {tag}_NDIM {t.ndim}")
            for d, n in enumerate(t.shape):  # an extent known only at run time: in the comment above
                if isinstance(n, int):
                    lines.append(f"#define {tag}_DIM{d} {n}")
            if all(isinstance(n, int) for n in t.shape):
                lines.append(f"#define {tag}_SIZE {t.size}")
            ctype = C_TYPES[t.dtype]
            if a.kind == "scalar":
                params.append(f"{ctype} {a.name}")
            else:
                params.append(f"{'' if a.output else 'const '}{ctype} *{a.name}")
        args = ", ".join(params) or "void"
        lines += [f"int {e.name}({args});", f"int {e.name}_ex({args}, int64_t info[4]);", ""]
    lines += ["#ifdef __cplusplus", "}", "#endif", "", f"#endif /* {guard} */", ""]
    return "\n".join(lines)
