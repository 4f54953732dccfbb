"""Exported kernels called from C: on the host, and for aarch64 and 32-bit ARM under qemu.

Each kernel is exported, linked into a C program that reads its inputs from files and
writes its outputs, and the outputs are compared with the Python kernel's. The tests of
another CPU skip only where its cross compiler or qemu is missing, and never in CI
(``TE_GRAD_REQUIRE_ALL=1`` turns a skip into a failure)."""
import os
import shutil
import subprocess

import numpy as np
import pytest

import te_grad as tg
from codegen.export import C_TYPES

RNG = np.random.default_rng(14)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CROSS = {
    "host": ("cc", []),
    "aarch64-linux-gnu": ("aarch64-linux-gnu-gcc", ["qemu-aarch64"]),
    "armv7-linux-gnueabihf": ("arm-linux-gnueabihf-gcc", ["qemu-arm"]),
}


def toolchain(target):
    cc, runner = CROSS[target]
    missing = [tool for tool in [cc] + runner if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (Debian: gcc-aarch64-linux-gnu "
                    "libc6-dev-arm64-cross gcc-arm-linux-gnueabihf libc6-dev-armhf-cross qemu-user)")
    return cc, runner


def harness(name, kernel, scalars=()) -> str:
    """A C program: read every input from NAME.in<k>, call the entry, write NAME.out<k>, print rc."""
    lines = ["#include <stdio.h>", "#include <stdlib.h>", f'#include "{name}.h"', "",
             "static void *load(const char *p, size_t n) { FILE *f = fopen(p, \"rb\"); void *m = malloc(n ? n : 1);",
             "  if (!f || fread(m, 1, n, f) != n) { fprintf(stderr, \"cannot read %s\\n\", p); exit(3); }",
             "  fclose(f); return m; }",
             "static void save(const char *p, const void *m, size_t n) { FILE *f = fopen(p, \"wb\"); "
             "fwrite(m, 1, n, f); fclose(f); }",
             "int main(void) {"]
    args = []
    for k, t in enumerate(kernel.inputs):
        ctype = C_TYPES[t.dtype]
        lines.append(f"  {ctype} *in{k} = load(\"in{k}.bin\", sizeof({ctype}) * {t.size});")
        args.append(f"in{k}[0]" if any(t is s for s in scalars) else f"in{k}")
    for k, t in enumerate(kernel.outputs):
        ctype = C_TYPES[t.dtype]
        lines.append(f"  {ctype} *out{k} = malloc(sizeof({ctype}) * {max(1, t.size)});")
        args.append(f"out{k}")
    lines += ["  int64_t info[4] = {0, 0, 0, 0};",
              f"  int rc = {name}_ex({', '.join(args)}, info);",
              "  printf(\"rc %d info %lld %lld %lld %lld\\n\", rc, (long long)info[0], (long long)info[1], "
              "(long long)info[2], (long long)info[3]);"]
    for k, t in enumerate(kernel.outputs):
        lines.append(f"  save(\"out{k}.bin\", out{k}, sizeof({C_TYPES[t.dtype]}) * {t.size});")
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def run_exported(kernel, arrays, target, tmp_path, name="kernel", threads=1, scalars=()):
    cc, runner = toolchain(target)
    d = tmp_path / target
    d.mkdir(exist_ok=True)
    files = kernel.export(str(d / name), target=target, threads=threads, scalars=scalars)
    assert os.path.exists(files["object"]) and os.path.exists(files["header"])
    (d / "main.c").write_text(harness(name, kernel, scalars))
    for k, a in enumerate(arrays):
        np.ascontiguousarray(a).tofile(d / f"in{k}.bin")
    cmd = [cc, "-std=c99", "-Wall", "-Werror", "-O2", "-static", "-pthread", "-I", str(d), "-o", str(d / "prog"),
           str(d / "main.c"), files["object"], "-lm", "-lpthread"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    done = subprocess.run(runner + [str(d / "prog")], capture_output=True, text=True, cwd=d, timeout=600)
    assert done.returncode == 0, done.stderr
    rc, *info = [int(v) for v in done.stdout.split()[1::1] if v.lstrip("-").isdigit()]
    outs = [np.fromfile(d / f"out{k}.bin", dtype=t.dtype).reshape(t.shape) for k, t in enumerate(kernel.outputs)]
    return rc, info, outs


def conv_gradient_kernel(dtype="float32"):
    X = tg.placeholder((2, 3, 9, 9), name="X", dtype=dtype)
    W = tg.placeholder((4, 3, 3, 3), name="W", dtype=dtype)
    Y = tg.nn.conv2d(X, W, stride=2, padding=1)
    dY = tg.placeholder(Y.shape, name="dY", dtype=dtype)
    dX, dW = tg.gradient(Y, [X, W], head=dY)
    kernel = tg.build([Y, dX, dW], [X, W, dY])
    arrays = [RNG.standard_normal(t.shape).astype(dtype) for t in (X, W, dY)]
    return kernel, arrays


@pytest.mark.parametrize("target", sorted(CROSS))
@pytest.mark.parametrize("threads", [1, 3])
def test_conv_gradient_from_c_equals_the_python_kernel(target, threads, tmp_path):
    kernel, arrays = conv_gradient_kernel()
    want = kernel(*arrays)
    rc, _, got = run_exported(kernel, arrays, target, tmp_path, "conv_grad", threads=threads)
    assert rc == 0
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5 * np.abs(w).max())


@pytest.mark.parametrize("target", sorted(CROSS))
def test_float64_scalars_and_bad_ids(target, tmp_path):
    table = tg.placeholder((6, 4), name="table", dtype="float64")
    ids = tg.placeholder((5,), name="ids", dtype="int64")
    scale = tg.placeholder((), name="scale", dtype="float64")
    rows = tg.compute((5, 4), lambda i, j: table[ids[i], j] * scale[()], name="rows")
    head = tg.placeholder((5, 4), name="head", dtype="float64")
    dtable, = tg.gradient(rows, [table], head=head)
    kernel = tg.build([rows, dtable], [table, ids, scale, head])
    arrays = [RNG.standard_normal((6, 4)), np.array([5, 0, 2, 2, 1]), np.array(1.5), RNG.standard_normal((5, 4))]
    rc, _, got = run_exported(kernel, arrays, target, tmp_path, "rows", scalars=[scale])
    assert rc == 0
    for g, w in zip(got, kernel(*arrays)):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    arrays[1] = np.array([5, 0, 6, 2, 1])  # 6 is not a row of the table
    rc, info, _ = run_exported(kernel, arrays, target, tmp_path, "rows", scalars=[scale])
    assert rc == 1  # ROWS_ERROR_INDEX
    assert info[2] == 6 and kernel.buffers[info[0]].name == "table"
    header = (tmp_path / target / "rows.h").read_text()
    assert "#define ROWS_ERROR_INDEX 1" in header and "int rows(const double *table" in header
    assert "double scale" in header


def test_riscv64_object_and_explicit_cpu(tmp_path):
    kernel, _ = conv_gradient_kernel()
    files = kernel.export(str(tmp_path / "k"), target="riscv64-linux-gnu")
    elf = open(files["object"], "rb").read(20)
    assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == 243  # EM_RISCV
    files = kernel.export(str(tmp_path / "k2"), target="aarch64-linux-gnu", cpu="cortex-a72", features="+neon")
    elf = open(files["object"], "rb").read(20)
    assert int.from_bytes(elf[18:20], "little") == 183  # EM_AARCH64
    with pytest.raises(tg.UserError, match="target"):
        kernel.export(str(tmp_path / "k3"), target="nonsense-cpu-none")


def test_shared_library_on_the_host(tmp_path):
    toolchain("host")
    import ctypes
    kernel, arrays = conv_gradient_kernel()
    files = kernel.export(str(tmp_path / "conv"), shared=True)
    lib = ctypes.CDLL(files["shared"])
    outs = [np.empty(t.shape, np.float32) for t in kernel.outputs]
    ptrs = [a.ctypes.data_as(ctypes.c_void_p) for a in list(arrays) + outs]
    assert lib.conv(*ptrs) == 0
    for g, w in zip(outs, kernel(*arrays)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("target", ["host", "aarch64-linux-gnu"])
def test_the_c_example_trains_like_the_python_trainer(target, tmp_path):
    pytest.importorskip("sklearn")
    cc, runner = toolchain(target)
    out = tmp_path / "digits"
    subprocess.run(["python", os.path.join(ROOT, "examples", "c", "prepare.py"), str(out), "--target", target],
                   check=True, capture_output=True, text=True)
    prog = out / "train_digits"
    subprocess.run([cc, "-std=c99", "-Wall", "-Werror", "-O2", "-static", "-I", str(out), "-o", str(prog),
                    os.path.join(ROOT, "examples", "c", "train_digits.c"), str(out / "digits.o"), "-lm"],
                   check=True, capture_output=True, text=True)
    done = subprocess.run(runner + [str(prog), str(out / "digits_data.bin")], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    c_losses = [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("step")]
    py_losses = [float(line.split()[-1]) for line in (out / "python_losses.txt").read_text().splitlines()]
    assert len(c_losses) == len(py_losses) > 10
    np.testing.assert_allclose(c_losses, py_losses, rtol=1e-4)
    assert "test accuracy" in done.stdout


def _compiles(header_path, tmp_path, cc):
    """gcc (and g++, where installed: the header is also C++) accept the header."""
    main = tmp_path / "use_header.c"
    main.write_text(f'#include "{header_path}"\nint main(void) {{ return 0; }}\n')
    done = subprocess.run([cc, "-std=c99", "-Wall", "-Werror", "-pedantic", "-fsyntax-only", str(main)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    if shutil.which("g++"):
        done = subprocess.run(["g++", "-Wall", "-Werror", "-fsyntax-only", "-x", "c++", str(main)],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_entry_point_names_c_refuses_are_user_errors(tmp_path):
    cc, _ = toolchain("host")
    X = tg.placeholder((3,), name="int")        # argument names C refuses are renamed in the header
    S = tg.placeholder((), name="class")
    Y = tg.compute((3,), lambda i: tg.exp(X[i]) * S[()], name="double")
    kernel = tg.build([Y], [X, S])
    for name, needle in [("int", "C keyword"), ("_Bool", "C keyword"), ("typeof", "C keyword"),
                         ("constexpr", "C keyword"), ("template", "C keyword"), ("__kernel", "reserved"),
                         ("a__b", "reserved"), ("_Kernel", "reserved"), ("_kernel", "reserved"),
                         ("1conv", "not a C identifier"), ("conv-grad", "not a C identifier"),
                         ("", "not a C identifier"), ("int64_t", "<stdint.h>"), ("INT32_MAX", "<stdint.h>"),
                         ("malloc", "the exported object calls"), ("memset", "the exported object calls"),
                         ("expf", "the exported object calls"), ("K_OK", "a macro the header defines"),
                         ("K_ERROR_INDEX", "a macro")]:
        with pytest.raises(tg.UserError, match="export") as info:
            kernel.export(str(tmp_path / "k"), name=name, scalars=[S])
        assert needle in str(info.value) and repr(name) in str(info.value), info.value
    with pytest.raises(tg.UserError, match="C keyword"):
        kernel.export(str(tmp_path / "int"))    # the file's name names the entry point
    with pytest.raises(tg.UserError, match="declares f_ex, as does entry point name 'f'"):
        tg.export(str(tmp_path / "two"), {"f": (kernel, [X, S, Y]), "f_ex": (kernel, [X, S, Y])})
    with pytest.raises(tg.UserError, match="constant name 'float'"):
        tg.export(str(tmp_path / "c"), {"f": (kernel, [X, S, Y])}, constants={"float": np.zeros(2, np.float32)})
    files = kernel.export(str(tmp_path / "k"), name="int_kernel", scalars=[S])
    text = open(files["header"]).read()
    assert "int int_kernel(const float *int_arg, float class_arg, float *double_arg);" in text
    _compiles(files["header"], tmp_path, cc)
    files = kernel.export(str(tmp_path / "conv-grad"), scalars=[S])  # a file name is made a C name
    assert "int conv_grad(" in open(files["header"]).read()
    _compiles(files["header"], tmp_path, cc)


def test_the_header_documents_every_scalar_argument(tmp_path):
    cc, _ = toolchain("host")
    from te_grad import train
    x = tg.placeholder((4, 5), name="x")
    y = tg.placeholder((4, 3), name="y")
    model = train.Sequential(train.Linear(5, 3))
    trainer = train.Trainer(model, inputs=[x], targets=[y], loss=tg.nn.mse_loss, optimizer=train.Adam(lr=1e-2),
                            progress=False)
    files = trainer.export(str(tmp_path / "model"))
    text = open(files["header"]).read()
    prototype = next(line for line in text.splitlines() if line.startswith("int model_step("))
    assert "int64_t seed, float lr, float t" in prototype
    for scalar in ("seed", "lr", "t"):
        at = text.index(f"/* scalar input {scalar}: ")
        comment = text[at:text.index("*/", at)]
        assert "passed by value" in comment and len(comment.split()) > 12, comment
    t_doc = text[text.index("/* scalar input t: "):]
    assert "1 for the first step (NOT 0)" in t_doc and "divides by zero" in t_doc
    assert "new value" in text[text.index("/* scalar input seed: "):]
    assert "learning rate" in text[text.index("/* scalar input lr: "):]
    assert "must not overlap state_in" in text
    _compiles(files["header"], tmp_path, cc)
    # a kernel's own scalars are marked as passed by value
    S = tg.placeholder((), name="scale")
    Y = tg.compute((4, 5), lambda i, j: x[i, j] * S[()], name="Y")
    files = tg.build([Y], [x, S]).export(str(tmp_path / "scaled"), scalars=[S])
    assert "/* scalar input scale: float32[], passed by value */" in open(files["header"]).read()


def test_an_export_of_constants_alone_writes_its_object_and_header(tmp_path):
    files = tg.export(str(tmp_path / "weights"), {}, constants={"w": np.arange(3, dtype=np.float32)})
    assert os.path.getsize(files["object"]) > 0 and "w" in open(files["header"]).read()
