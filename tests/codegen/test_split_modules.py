"""Kernel modules split per stage (codegen.jit.split_module): each stage function compiled and
cached on its own, shared by kernels that contain the same stage."""
import os
import re

import numpy as np

import codegen
import te_grad as tg
from codegen import compile_worker, jit
from codegen.llvm import binding as llvm

RNG = np.random.default_rng(0)


def _mlp(width, hidden):
    x, w1, w2 = (tg.placeholder(s, name=n) for s, n in (((8, width), "x"), ((width, hidden), "w1"),
                                                          ((hidden, 3), "w2")))
    k = tg.reduce_axis(width, "k")
    h = tg.compute((8, hidden), lambda i, j: tg.maximum(tg.sum(x[i, k] * w1[k, j], axis=[k]), 0.0),
                   name="h")
    m = tg.reduce_axis(hidden, "m")
    y = tg.compute((8, 3), lambda i, j: tg.sum(h[i, m] * w2[m, j], axis=[m]), name="y")
    outs = [y] + list(tg.gradient(y, [w1, w2]))
    return outs, [x, w1, w2]


def _numpy_mlp(x, w1, w2):
    pre = x @ w1
    h = np.maximum(pre, 0)
    head = np.ones((8, 3), np.float32)
    return h @ w2, x.T @ ((head @ w2.T) * (pre > 0)), h.T @ head


def _check(kern, width, hidden):
    x, w1, w2 = (RNG.standard_normal(s).astype(np.float32) for s in ((8, width), (width, hidden), (hidden, 3)))
    for got, want in zip(kern(x, w1, w2), _numpy_mlp(x, w1, w2)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _counting(monkeypatch):
    compiled = []
    parts = jit._compile_parts

    def counting(texts):
        compiled.extend(texts)
        return parts(texts)
    monkeypatch.setattr(jit, "_compile_parts", counting)
    return compiled


def test_a_second_model_compiles_only_the_stages_it_does_not_share(monkeypatch):
    with codegen.compile_options(disk_cache=False):
        jit.clear_cache()
        compiled = _counting(monkeypatch)
        first = tg.build(*_mlp(16, 32))
        parts = jit.split_module(first._compiled.text, [codegen.RUN_STAGES, codegen.RUN_REGION])
        assert parts is not None and len(parts.parts) >= 3
        assert len(compiled) == len({s for s, _ in parts.parts}) + 1  # every stage and the entry points
        _check(first, 16, 32)
        compiled.clear()
        second = tg.build(*_mlp(24, 32))  # the second layer's stages are the first model's
        again = jit.split_module(second._compiled.text, [codegen.RUN_STAGES, codegen.RUN_REGION])
        shared = {s for s, _ in again.parts} & {s for s, _ in parts.parts}
        assert shared and 1 <= len(compiled) <= len({s for s, _ in again.parts}) + 1 - len(shared)
        _check(second, 24, 32)


def _functions(text):
    """``{name: definition}`` of an optimized module's functions, attribute groups written out,
    metadata numbers (numbered per module) and the function's own name left out."""
    groups = dict(re.findall(r"^attributes (#\d+) = \{ (.*) \}$", text, re.M))
    out = {}
    for m in re.finditer(r'^define [^\n]*?@"?([\w.]+)"?\([\s\S]*?^}$', text, re.M):
        body = re.sub(r"(#\d+)", lambda g: "{" + groups.get(g.group(1), g.group(1)) + "}", m.group(0))
        out[m.group(1)] = re.sub(r"!\d+", "!N", body.replace(m.group(1), "_", 1))
    return out


def test_a_stage_compiled_alone_is_the_code_of_the_whole_module():
    outs, ins = _mlp(16, 32)
    with codegen.compile_options(disk_cache=False):
        kern = tg.build(outs, ins)
    whole = _functions(kern.llvm_ir)  # the whole module optimized at once
    split = jit.split_module(kern._compiled.text, [codegen.RUN_STAGES, codegen.RUN_REGION])
    target = jit.host_target()
    stages = {body for name, body in whole.items() if name.startswith("stage")}
    assert len(stages) == len(split.parts)
    for symbol, text in split.parts:
        alone = _functions(str(compile_worker.optimize(llvm, text, target.triple, target.machine,
                                                       llvm.create_context())))
        assert list(alone) == [symbol] and alone[symbol] in stages


def test_damaged_part_entries_are_rebuilt(tmp_path):
    with codegen.compile_options(disk_cache=True, cache_dir=str(tmp_path)):
        jit.clear_cache()
        _check(tg.build(*_mlp(16, 32)), 16, 32)
        objects = [n for n in os.listdir(tmp_path) if n.startswith("obj-")]
        assert len(objects) >= 4  # the parts, each an entry of its own
        for n in objects:  # every object cut short or overwritten with another's bytes
            with open(tmp_path / n, "r+b") as f:
                data = f.read()
                f.seek(0)
                f.write(data[: len(data) // 2] if hash(n) % 2 else bytes(reversed(data)))
                f.truncate()
        jit.clear_cache()
        _check(tg.build(*_mlp(16, 32)), 16, 32)  # found nothing usable: rebuilt, right


def test_split_modules_need_two_stages_and_no_private_definitions():
    one = 'declare float @"llvm.sqrt.f32"(float %".1")\n\ndefine i32 @"stage0_a"(float* %".1")\n{\nentry:\n' \
          '  ret i32 0\n}\n\ndefine i32 @"run_stages"()\n{\nentry:\n  ret i32 0\n}\n'
    assert jit.split_module(one, ["run_stages"]) is None
    two = one + '\ndefine i32 @"stage1_b"(float* %".1")\n{\nentry:\n  ret i32 1\n}\n'
    split = jit.split_module(two, ["run_stages"])
    assert split is not None and len(split.parts) == 2
    assert 'declare i32 @"' + split.parts[0][0] + '"(float* %".1")' in split.glue
    assert jit.split_module(two.replace('define i32 @"stage1_b"', 'define internal i32 @"stage1_b"'),
                            ["run_stages"]) is None


def test_the_module_text_is_llvmlites_printing_of_the_module(monkeypatch):
    from codegen import llvm_module
    seen = []
    reprint = llvm_module._module_text

    def checking(module, texts):
        text = reprint(module, texts)
        seen.append(text == str(module))
        return text
    monkeypatch.setattr(llvm_module, "_module_text", checking)
    with codegen.compile_options(disk_cache=False):
        _check(tg.build(*_mlp(16, 32)), 16, 32)
    assert seen == [True]
