"""Compiles the fused step for sm_90 (no GPU needed) and prints, as JSON, where each
operand of its warpgroup MMAs (wgmma) comes from: a pipelined shared-memory buffer of
N stages, or registers; and how many of its mma.sync products wait for another's sum.
Run in a process without TRITON_INTERPRET (test_mlp_step.py starts it): the interpreter
replaces the kernels the compiler needs.

    python tests/wgmma_buffers.py tf32 '{"swap": 7, "copies": 3}'

Written by hand: Triton reports neither, so this reads its TTGIR text.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import types

import torch


def operand_sources(ttgir: str) -> list[str]:
    """For each operand of each `ttng.warp_group_dot`, 'registers' or 'buffers=N'."""
    lines = ttgir.splitlines()

    def definition(name: str, before: int) -> tuple[int, str]:
        for j in range(before - 1, -1, -1):  # SSA names repeat across regions: the nearest
            found = re.match(r"\s*(%[\w.]+)(?::\d+)? = (.*)", lines[j])
            if found and found.group(1) == name:
                return j, found.group(2)
        raise ValueError(f"no definition of {name} before line {before}")

    def source(name: str, at: int) -> str:
        j, text = definition(name, at)
        view = re.match(r"ttg\.memdesc_(?:trans|index|subslice|reinterpret) (%[\w.]+)", text)
        if view:
            return source(view.group(1), j)
        stages = re.match(r"ttg\.local_alloc : \(\) -> !ttg\.memdesc<(\d+)x", text)
        if stages:
            return f"buffers={stages.group(1)}"
        return "registers"  # a local_alloc of a register tensor, or a register operand

    sources = []
    for i, line in enumerate(lines):
        dot = re.search(r"ttng\.warp_group_dot (%[\w.]+), (%[\w.]+),", line)
        if dot:
            sources += [source(dot.group(1), i), source(dot.group(2), i)]
    return sources


def chained_dots(ttgir: str) -> list[bool]:
    """For each `tt.dot` (the MMAs of mma.sync), whether its accumulator is the result of
    another dot: a product that waits for the one before it."""
    lines = ttgir.splitlines()
    made_by = {}
    chained = []
    for line in lines:
        found = re.match(r"\s*(%[\w.#]+)(?::\d+)? = (\S+)", line)
        dot = re.search(r"= tt\.dot (%[\w.#]+), (%[\w.#]+), (%[\w.#]+)", line)
        if dot:
            chained.append(made_by.get(dot.group(3)) == "tt.dot")
        if found:  # SSA names repeat across regions: the latest definition is the one in scope
            made_by[found.group(1)] = found.group(2)
    return chained


def compile_step(precision: str, changes: dict[str, int]) -> tuple[str, int]:
    """The TTGIR of the study shape's step (3x512, batch 512) for sm_90, and its stages."""
    torch.cuda.get_device_properties = lambda device=None: types.SimpleNamespace(multi_processor_count=132)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels.ops import mlp_step
    from kernels.ops.optim import FlatOptimizer
    from model.mlp import MLP
    from model.train import OPTIMIZERS

    model = MLP(75, 512, 3, 10, "leaky_relu")
    optimizer = FlatOptimizer(list(model.parameters()), "adam", **OPTIMIZERS["adam"][1])
    x, y = torch.randn(1024, 75), torch.randint(0, 10, (1024,))
    step = mlp_step.FusedStep(x, y, [*model.hidden, model.head], optimizer, "leaky_relu", precision, 512)
    blocks = mlp_step.blocks_for(512, 512, 132, precision, interpreter=False)
    step.use_blocks(dataclasses.replace(blocks, **changes))
    args, kwargs = step._arguments(torch.zeros(512, dtype=torch.int64), torch.zeros(()))
    options = {"num_warps": kwargs.pop("num_warps"), "num_stages": kwargs.pop("num_stages")}
    values = dict(zip(mlp_step._step_kernel.arg_names, args), times_ptr=kwargs.pop("times_ptr"))
    types_of = {torch.float32: "*fp32", torch.int64: "*i64", torch.int32: "*i32", torch.bfloat16: "*bf16"}
    signature, constants, attrs = {}, {}, {}
    for i, name in enumerate(mlp_step._step_kernel.arg_names):
        if name in kwargs:
            signature[name], constants[name] = "constexpr", kwargs[name]
            continue
        value = values[name]
        if isinstance(value, torch.Tensor):
            signature[name] = types_of[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]  # as a launch specializes aligned pointers
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(mlp_step._step_kernel, signature, constants, attrs)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    return kernel.asm["ttgir"], options["num_stages"]


if __name__ == "__main__":
    ttgir, stages = compile_step(sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
    chained = chained_dots(ttgir)
    print(json.dumps({"stages": stages, "sources": operand_sources(ttgir), "dots": len(chained),
                      "chained_dots": sum(chained)}))
