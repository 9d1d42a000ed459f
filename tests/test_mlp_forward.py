"""kernels/ops/mlp_forward.py: the whole few-row forward in one launch. On a CPU through
Triton's interpreter (one program, so the grid barriers pass at once); on a GPU with a
program per SM, from a CUDA graph too."""

from __future__ import annotations

import pytest
import torch

from kernels.ops import mlp_forward
from kernels.ops.linear_act import linear_act_stack
from model.mlp import _TORCH_ACTIVATIONS
from tests.devices import CUDA
from tests.devices import DEVICE

REFERENCE = {"identity": lambda z: z, **_TORCH_ACTIVATIONS}  # torch's own, as eager torch runs them


def network(widths, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    ws = [(torch.randn(o, i, generator=g) / i**0.5).to(DEVICE, dtype) for i, o in zip(widths, widths[1:])]
    bs = [(torch.randn(o, generator=g) / 4).to(DEVICE, dtype) for o in widths[1:]]
    return ws, bs


def exact(x, ws, bs, acts):
    """float64 through the layers, W and X rounded to X's dtype first, as the kernel does."""
    h = x.double()
    for w, b, a in zip(ws, bs, acts):
        h = REFERENCE[a](h @ w.to(x.dtype).double().T + b.double())
    return h


@pytest.mark.parametrize(("widths", "rows", "acts"), [
    ([75, 32, 24, 10], 1, ["relu", "silu", "identity"]),
    ([75, 130, 10], 3, ["leaky_relu", "identity"]),  # strips and reduction steps left partial
    ([20, 16, 16, 16, 16, 16, 7], 16, ["tanh"] * 5 + ["identity"]),  # six layers, sixteen rows
    ([75, 10], 2, ["sigmoid"]),  # one layer: no barrier
], ids=["batch-1", "partial-tiles", "six-layers", "one-layer"])
def test_one_launch_matches_float64(widths, rows, acts) -> None:
    ws, bs = network(widths)
    x = torch.randn(rows, widths[0], generator=torch.Generator().manual_seed(1)).to(DEVICE)
    mlp_forward.LAUNCHES.clear()
    with torch.no_grad():
        y = linear_act_stack(x, ws, bs, acts)
    assert y.shape == (rows, widths[-1]) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), exact(x, ws, bs, acts), rtol=1e-5, atol=1e-5)
    assert list(mlp_forward.LAUNCHES) == [(rows, tuple(widths), "float32")]


def test_under_autocast_x_is_cast_and_w_rounded_to_its_dtype() -> None:
    """fp16 on a CPU (the interpreter has no bf16 dot elsewhere; kept alike), bf16 on a GPU."""
    low = torch.bfloat16 if CUDA else torch.float16
    ws, bs = network([75, 64, 10])
    x = torch.randn(1, 75, device=DEVICE)
    with torch.no_grad(), torch.autocast(DEVICE, low):
        y = linear_act_stack(x, ws, bs, ["relu", "identity"])
    assert y.dtype == low
    torch.testing.assert_close(y.double(), exact(x.to(low), ws, bs, ["relu", "identity"]), rtol=2e-2, atol=2e-2)


def test_with_gradients_wanted_the_stack_keeps_its_autograd_node() -> None:
    ws, bs = network([75, 32, 10])
    for t in (*ws, *bs):
        t.requires_grad_()
    mlp_forward.LAUNCHES.clear()
    y = linear_act_stack(torch.randn(1, 75, device=DEVICE), ws, bs, ["relu", "identity"])
    assert type(y.grad_fn).__name__ == "_EagerStackBackward" and not mlp_forward.LAUNCHES
    with torch.no_grad():  # the same parameters, inference: one launch
        linear_act_stack(torch.randn(1, 75, device=DEVICE), ws, bs, ["relu", "identity"])
    assert len(mlp_forward.LAUNCHES) == 1


def test_what_it_does_not_take() -> None:
    ws, bs = network([75, 32, 10])
    x = torch.randn(1, 75, device=DEVICE)
    assert mlp_forward.usable(x, ws, bs)
    assert not mlp_forward.usable(torch.randn(17, 75, device=DEVICE), ws, bs)  # more than MAX_ROWS
    assert not mlp_forward.usable(x, ws * 4, bs * 4)  # more than MAX_LAYERS
    assert not mlp_forward.usable(x, [ws[0].t().contiguous().t(), ws[1]], bs)  # a transposed view
    assert not mlp_forward.usable(x, [ws[0].to(torch.float64), ws[1]], bs)


@pytest.mark.parametrize(("rows", "widths", "sms", "fits", "programs"), [
    (1, [75, 512, 512, 512, 10], 132, True, 128), (1, [75, 1024, 1024, 10], 132, True, 128),
    (1, [75, 2048, 2048, 10], 132, False, 128), (16, [75, 512, 10], 132, False, 128), (3, [75, 128, 10], 1, False, 1),
])
def test_tiles_fit_registers_and_programs_fit_the_sms(rows, widths, sms, fits, programs) -> None:
    plan = mlp_forward.tile(rows, widths, sms)
    size = plan.block_m * plan.block_n * plan.block_k
    assert plan.fits == fits
    assert plan.programs == programs  # a strip of the widest layer for each, no more programs than SMs
    assert plan.block_m >= rows
    assert size <= (mlp_forward.FIT_TILE if fits else mlp_forward.MAX_TILE)
    assert plan.programs * plan.block_n >= max(widths[1:]) or plan.programs == sms
    assert not fits or plan.block_k >= max(widths[:-1])  # fitting: the whole reduction in one step
    assert all(v & (v - 1) == 0 for v in (plan.block_m, plan.block_n, plan.block_k))


@pytest.mark.skipif(CUDA, reason="plants a GPU's program count on the interpreter's path")
def test_on_a_gpu_layers_that_do_not_fit_a_strip_per_program_go_layer_by_layer(monkeypatch) -> None:
    """The streamed (looped) one launch lost to layer-by-layer launches on an H200."""
    monkeypatch.setattr(mlp_forward, "_programs_max", lambda device: 132)
    ws, bs = network([75, 512, 10])
    x = torch.randn(16, 75, device=DEVICE)  # 16 rows x 512 columns: no strip per program fits
    assert not mlp_forward.tile(16, [75, 512, 10], 132).fits
    mlp_forward.LAUNCHES.clear()
    with torch.no_grad():
        assert mlp_forward.fused_forward(x, ws, bs, [1, 0]) is None
        y = linear_act_stack(x, ws, bs, ["relu", "identity"])
    assert not mlp_forward.LAUNCHES
    torch.testing.assert_close(y.double(), exact(x, ws, bs, ["relu", "identity"]), rtol=1e-4, atol=1e-4)


def test_the_switch_is_checked() -> None:
    assert mlp_forward.enabled_from_env(None) and not mlp_forward.enabled_from_env("0")
    with pytest.raises(ValueError, match="LOADBENCH_FUSED_FORWARD='off'"):
        mlp_forward.enabled_from_env("off")


gpu = pytest.mark.gpu


def _epochs(slot: int | None = None) -> set[int]:
    """The epochs of a stream's slot (the current stream's by default): one value between launches."""
    if slot is None:
        slot = torch.cuda.current_stream().stream_id % mlp_forward.SLOTS
    return set(mlp_forward._EPOCHS[torch.cuda.current_device()][slot].tolist())


@gpu
@pytest.mark.parametrize("widths", [[75, 512, 512, 512, 10], [75, 1024, 1024, 1024, 1024, 1024, 10]],
                         ids=["optimal", "widest-deepest"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_the_gpu_every_program_waits_for_the_layer(widths, dtype) -> None:
    """A program per SM, tagged hand-overs between layers: each launch moves every
    epoch of its slot on by one, and a CUDA graph replaying the launch 200 times,
    captured on another stream, gives the eager bits."""
    ws, bs = network(widths, dtype=dtype)
    acts = ["silu"] * (len(ws) - 1) + ["identity"]
    x = torch.randn(1, widths[0], device="cuda").to(dtype)
    with torch.no_grad():
        y = linear_act_stack(x, ws, bs, acts)
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(y.double(), exact(x, ws, bs, acts), rtol=tol, atol=tol)
        (epoch,) = _epochs()
        linear_act_stack(x, ws, bs, acts)
        assert _epochs() == {epoch + 1}
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = linear_act_stack(x, ws, bs, acts)
            slot = torch.cuda.current_stream().stream_id % mlp_forward.SLOTS
        (before,) = _epochs(slot)
        for _ in range(200):
            graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, y)
        assert _epochs(slot) == {before + 200}
    programs = mlp_forward.LAUNCHES[(1, tuple(widths), str(dtype).removeprefix("torch."))]["programs"]
    assert programs > 1


@gpu
def test_on_the_gpu_no_launch_reads_another_launchs_words(monkeypatch) -> None:
    """Launches back to back on one slot, each with new inputs, the shapes and program
    counts changing between them (a stale word of another shape or launch must never
    pass for this one's), one of them growing the scratch rows after a graph was
    captured on the first ones: every output matches torch's, eagerly and replayed."""
    monkeypatch.setattr(mlp_forward, "_EPOCHS", {})
    monkeypatch.setattr(mlp_forward, "_SCRATCH", {})
    # six layers of 512: 5 x 512 scratch words, more than the first rows hold
    shapes = [[75, 512, 512, 512, 10], [75, 256, 1024, 10], [75, 512, 512, 512, 512, 512, 10], [75, 128, 128, 10],
              [75, 1024, 1024, 1024, 1024, 10]]
    nets = [network(widths, seed=i) for i, widths in enumerate(shapes)]
    acts = {len(ws): ["leaky_relu"] * (len(ws) - 1) + ["identity"] for ws, _ in nets}
    xs = torch.randn(600, 75, device="cuda")
    mlp_forward.LAUNCHES.clear()
    with torch.no_grad():
        static = torch.zeros(1, 75, device="cuda")
        linear_act_stack(static, *nets[0], acts[4])  # the eager call that allocates the slots
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = linear_act_stack(static, *nets[0], acts[4])
        outs = [linear_act_stack(x[None], *nets[i % 5], acts[len(nets[i % 5][0])]) for i, x in enumerate(xs)]
        assert len(_epochs()) == 1  # launches of 128 and of 64 programs kept every epoch of the slot equal
        assert len(mlp_forward._SCRATCH[torch.cuda.current_device()]) == 2  # grown; the graph's rows kept
        graph_outs = []
        for x in xs[:300]:
            static.copy_(x[None])
            graph.replay()
            graph_outs.append(replayed.clone())
        torch.cuda.synchronize()
    for i, (x, y) in enumerate(zip(xs, outs)):
        ws, bs = nets[i % 5]
        torch.testing.assert_close(y.double(), exact(x[None], ws, bs, acts[len(ws)]), rtol=1e-4, atol=1e-4)
    ws, bs = nets[0]
    torch.testing.assert_close(torch.cat(graph_outs).double(), exact(xs[:300], ws, bs, acts[4]), rtol=1e-4, atol=1e-4)
    assert {widths for _, widths, _ in mlp_forward.LAUNCHES} == {tuple(w) for w in shapes}  # each took one launch


@gpu
@pytest.mark.parametrize(("widths", "rows"), [([8, 8, 8, 4], 1), ([8, 8, 8, 4], 3), ([75, 128, 8192], 1)],
                         ids=["tiny", "tiny-3-rows", "wide-head-8-warps"])
def test_on_the_gpu_inputs_smaller_than_the_program_read_fresh_words(widths, rows) -> None:
    """A layer's input with fewer elements than the program has threads is held by
    several threads at once, each loading its own copy while it waits; every copy must
    carry the launch's tag before it is used. 300 eager launches and 300 replays, each
    with new inputs, against float64."""
    ws, bs = network(widths, seed=3)
    acts = ["relu"] * (len(ws) - 1) + ["identity"]
    xs = torch.randn(300, rows, widths[0], device="cuda")
    mlp_forward.LAUNCHES.clear()
    with torch.no_grad():
        eager = torch.stack([linear_act_stack(x, ws, bs, acts) for x in xs])
        static = torch.zeros(rows, widths[0], device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = linear_act_stack(static, ws, bs, acts)
        replayed = []
        for x in xs:
            static.copy_(x)
            graph.replay()
            replayed.append(out.clone())
        torch.cuda.synchronize()
    assert list(mlp_forward.LAUNCHES) == [(rows, tuple(widths), "float32")]  # one launch, eager and captured
    expected = torch.stack([exact(x, ws, bs, acts) for x in xs])
    torch.testing.assert_close(eager.double(), expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.stack(replayed).double(), expected, rtol=1e-4, atol=1e-4)


@gpu
def test_on_the_gpu_width_2048_goes_layer_by_layer() -> None:
    ws, bs = network([75, 2048, 2048, 10])
    x = torch.randn(1, 75, device="cuda")
    mlp_forward.LAUNCHES.clear()
    with torch.no_grad():
        y = linear_act_stack(x, ws, bs, ["relu", "relu", "identity"])
    assert not mlp_forward.LAUNCHES
    torch.testing.assert_close(y.double(), exact(x, ws, bs, ["relu", "relu", "identity"]), rtol=1e-4, atol=1e-4)


@gpu
def test_a_first_call_during_capture_launches_layer_by_layer(monkeypatch) -> None:
    monkeypatch.setattr(mlp_forward, "_EPOCHS", {})
    monkeypatch.setattr(mlp_forward, "_SCRATCH", {})
    ws, bs = network([75, 64, 10])
    x = torch.randn(1, 75, device="cuda")
    mlp_forward.LAUNCHES.clear()
    with torch.no_grad():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = linear_act_stack(x, ws, bs, ["relu", "identity"])
        graph.replay()
        torch.cuda.synchronize()
    assert not mlp_forward.LAUNCHES and not mlp_forward._EPOCHS and not mlp_forward._SCRATCH
    torch.testing.assert_close(out.double(), exact(x, ws, bs, ["relu", "identity"]), rtol=1e-4, atol=1e-4)
