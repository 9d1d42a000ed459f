"""A trained model made ready to serve and called at one batch size.

`prepare` routes a model through an implementation (eager torch, torch.compile, or our
fused kernel) without changing it; a `Runner` holds one batch size's static input and
the call on it, captured in a CUDA graph where asked; `host_sync_in` says why a call
cannot be captured; `forward_routes` names the fused kernel's launches per batch size.
model.inference.measure times and scores these callables.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence

import torch

from kernels.ground.axes import Impl
from model.compress import Unsupported
from model.mlp import MLP
from model.train import precision_mode

WARMUP_CALLS = 3  # before timing or capture: compilation, autotuning, allocator growth


def prepare(model: torch.nn.Module, impl: str, device: torch.device) -> torch.nn.Module:
    """`model` ready to serve through `impl`, without changing it. 'triton' routes every
    layer of the MLP inside through our fused kernel, which takes plain dense fp32 or
    bf16 weights only (quantized and 2:4 tensors raise Unsupported); 'compile' is
    torch.compile with static shapes, one compilation per batch size."""
    model = model.to(device).eval()
    if impl == Impl.TRITON:
        mlps = [m for m in model.modules() if isinstance(m, MLP)]
        if not mlps:
            raise Unsupported("impl 'triton' routes model.mlp.MLP layers through the fused kernel; none inside")
        for mlp in mlps:
            for name, p in mlp.named_parameters():
                if type(p.data) is not torch.Tensor or p.layout != torch.strided or p.dtype not in (
                    torch.float32, torch.bfloat16
                ):
                    raise Unsupported(
                        f"impl 'triton': the fused kernel takes dense fp32 or bf16 weights; {name} is "
                        f"{type(p.data).__name__} {p.dtype}"
                    )
        model = copy.deepcopy(model)
        for mlp in model.modules():
            if isinstance(mlp, MLP):
                mlp.impl = "triton"
    elif impl == Impl.COMPILE:
        model = torch.compile(model, dynamic=False)
    return model


def host_sync_in(runner: Runner) -> str | None:
    """Why `runner`'s call cannot be captured in a CUDA graph, or None: the reason is a
    host read of the GPU inside the forward (torchao's int8 matmul formats its input's
    repr, for one), which fails a capture and leaves the stream unable to capture again,
    so it is looked for on one eager call under torch's sync debug mode instead. torch
    warns that the mode does not catch every synchronizing operation: one it misses still
    fails the capture, as before this check."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():  # that warning, once per case, would only repeat the above
        warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype")
        torch.cuda.set_sync_debug_mode("error")
    try:
        runner()
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"not capturable in a CUDA graph: the forward reads the GPU from the host ({first}); timed eagerly"
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    return None


class Runner:
    """One batch size: a static input buffer and the model's call on it, captured in a
    CUDA graph where asked (a replay is then the whole forward as one launch)."""

    def __init__(self, model: torch.nn.Module, batch: int, features: int, device: torch.device, graph: bool) -> None:
        self.model = model
        self.batch = batch
        self.x = torch.zeros(batch, features, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        with torch.no_grad(), precision_mode("fp32"):
            if graph:
                side = torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    for _ in range(WARMUP_CALLS):
                        self.out = model(self.x)
                torch.cuda.current_stream(device).wait_stream(side)
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph):
                    self.out = model(self.x)
            else:
                for _ in range(WARMUP_CALLS):
                    self.out = model(self.x)

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            with torch.no_grad(), precision_mode("fp32"):
                self.out = self.model(self.x)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Class predictions for `x` through exactly this callable, chunk by chunk (the
        last chunk padded with zeros, its padding dropped)."""
        out = []
        for chunk in x.split(self.batch):
            n = len(chunk)
            self.x[:n].copy_(chunk)
            self.x[n:].zero_()
            self()
            out.append(self.out[:n].argmax(1).clone())
        return torch.cat(out)


def forward_routes(batches: Sequence[int]) -> dict[str, list[str]]:
    """For the fused kernel: each batch size's forward launches, from the process's
    launch reports (a shape served earlier in the process is listed too): per layer
    'M x N x K: route (source)', e.g. '512x512x512: triton (table)', and for a forward
    of a few rows in one launch 'one launch, 4 layers: 128 programs, tile 1x4x512'."""
    from kernels.ops import mlp_forward  # lazily: kernels/ needs triton
    from kernels.plan.launches import launch_report

    out: dict[str, list[str]] = {}
    for entry in launch_report():
        m, n, k = entry["shape"]
        if entry["kernel"] == "fwd" and m in batches:
            out.setdefault(str(m), []).append(f"{m}x{n}x{k}: {entry['route']} ({entry['source']})")
    for (rows, widths, _dtype), launch in mlp_forward.LAUNCHES.items():
        if rows in batches:
            programs = f"{launch['programs']} program{'s' if launch['programs'] != 1 else ''}"
            line = f"one launch, {len(widths) - 1} layers: {programs}, tile {launch['tile']}"
            out.setdefault(str(rows), []).append(line)
    return {b: sorted(set(lines)) for b, lines in sorted(out.items(), key=lambda kv: int(kv[0]))}
