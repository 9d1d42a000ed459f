"""Build the one-launch training step for a Hopper GPU (sm_90) on any machine, no GPU needed.

    python -m bench.tools.step_compile --precision tf32
    python -m bench.tools.step_compile --precision tf32 --set m=32 --set split=2
    python -m bench.tools.step_compile --precision tf32 --set tma=1 --rows docs/data/step-builds.csv

Triton compiles kernels/ops/mlp_step.py's kernel at the study shape (3x512, batch 512, 132
SMs) with blocks_for's tiles and any --set Blocks field, and prints what the build holds:
registers a thread, the stack (spilled registers live there), spill stores and loads, and
SASS instructions (from the bundled cuobjdump and nvdisasm); --rows appends them as a row.
The interpreter that runs the CPU tests never calls Triton's compiler; this does
(tests/test_mlp_step.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.tools.rows import KINDS
from bench.tools.rows import append_rows
from bench.tools.rows import csv_problem
from bench.tools.rows import measured_here
from bench.tools.step_phases import blocks_changes
from bench.tools.step_phases import study_step
from bench.tools.step_phases import parse_setting

SMS = 132  # an H100 or H200 SXM


def build(precision: str, changes: dict) -> object:
    """The compiled kernel (triton's CompiledKernel) of a FusedStep at the study shape."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kernels.ops import mlp_step

    x, y = torch.zeros(600, 75), torch.zeros(600, dtype=torch.int64)
    step = study_step(x, y, 512, 3, precision, 512, sms=SMS)
    step.use_blocks(dataclasses.replace(step.blocks, **changes))
    args, kwargs = step._arguments(torch.arange(512), torch.zeros(()))
    pointers = {torch.float32: "*fp32", torch.int64: "*i64", torch.int32: "*i32", torch.bfloat16: "*bf16"}
    names = mlp_step._step_kernel.arg_names
    given = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    signature, constants = {}, {}
    for i, name in enumerate(names):
        value = given.get(name, kwargs.get(name))
        if isinstance(value, torch.Tensor):
            signature[name] = pointers[value.dtype]
        elif name in given:
            signature[name] = "fp32" if isinstance(value, float) else "i32"
        else:
            signature[name], constants[(i,)] = "constexpr", value
    source = ASTSource(fn=mlp_step._step_kernel, signature=signature, constexprs=constants)
    options = {key: kwargs[key] for key in ("num_warps", "num_stages", "maxnreg") if key in kwargs}
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def resources(cubin: bytes) -> dict[str, int]:
    """Registers, stack bytes, spill stores and loads and SASS instructions of a cubin."""
    import triton

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "step.cubin"
        path.write_bytes(cubin)
        usage = subprocess.run([str(tools / "cuobjdump"), "--dump-resource-usage", str(path)],
                               capture_output=True, text=True, check=True).stdout
        sass = subprocess.run([str(tools / "nvdisasm"), "-c", str(path)], capture_output=True, text=True,
                              check=True).stdout.splitlines()
    found = {key: int(re.search(rf"{key}:(\d+)", usage).group(1)) for key in ("REG", "STACK")}
    code = [line for line in sass if re.match(r"\s*/\*[0-9a-f]{4,}\*/", line)]
    return {"registers": found["REG"], "stack_bytes": found["STACK"],
            "spill_stores": sum(" STL" in line for line in code), "spill_loads": sum(" LDL" in line for line in code),
            "instructions": len(code)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tools.step_compile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", choices=("fp32", "tf32", "bf16"), default="tf32")
    parser.add_argument("--set", type=parse_setting, action="append", default=[], metavar="FIELD=VALUE",
                        help="a field of kernels/ops/mlp_step.py's Blocks (repeatable), e.g. split=2, warps=8")
    parser.add_argument("--rows", type=Path, default=None, metavar="CSV",
                        help="append the build's row to this CSV (docs/data/step-builds.csv)")
    args = parser.parse_args(argv)
    if args.rows is not None and (problem := csv_problem(args.rows, KINDS["step-builds"])):
        parser.error(f"--rows {args.rows}: {problem}")
    if os.environ.get("TRITON_INTERPRET") == "1":
        parser.error("TRITON_INTERPRET=1 replaces the compiler with the interpreter: unset it")
    from kernels.ops.mlp_step import Blocks

    fields = dataclasses.fields(Blocks)
    try:
        changes = blocks_changes(args.set, [f.name for f in fields], [f.name for f in fields if f.type == "bool"])
    except ValueError as exc:
        parser.error(str(exc))
    kernel = build(args.precision, changes)
    found = resources(kernel.asm["cubin"])
    settings = ", ".join(f"{k}={v}" for k, v in changes.items()) or "blocks_for"
    print(f"sm_90, 3x512, batch 512, {args.precision}, {settings}: "
          + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in found.items())
          + f", {kernel.metadata.shared} bytes of shared memory")
    if args.rows is not None:
        import triton

        command = " ".join([parser.prog, *(sys.argv[1:] if argv is None else argv)])
        row = {**measured_here("sm_90 build (no GPU)", "n/a"), "precision": args.precision, "blocks": settings,
               "triton": triton.__version__, **found, "shared_bytes": kernel.metadata.shared, "source": command,
               "note": "3x512, batch 512, 132 SMs"}
        print(f"appended {append_rows(args.rows, [row], KINDS['step-builds'])} row(s) to {args.rows}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
