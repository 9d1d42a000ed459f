"""kernels/runtime/direct_launch.py: Triton's binding once per launch signature, then the
compiled kernel's launcher. On a CPU with a stand-in kernel (the interpreter has no
compiled kernels); the GPU test runs the fused op both ways."""

from __future__ import annotations

import pytest
import torch

from kernels.runtime import direct_launch

CUDA = torch.cuda.is_available()


class Compiled:
    """Stands in for Triton's CompiledKernel: records the launcher calls."""

    function, packed_metadata = "fn-handle", "meta"

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, *args):
        self.calls.append(("direct", args))


class Kernel:
    """Stands in for a JITFunction `k(x_ptr, n, BLOCK: constexpr)`."""

    arg_names = ["x_ptr", "n", "BLOCK"]

    def __init__(self) -> None:
        self.calls: list = []

    def __getitem__(self, grid):
        def bind_and_launch(*args, **kwargs):
            self.calls.append(("triton", grid, args, kwargs))
            return Compiled(self.calls)

        return bind_and_launch


class Driver:
    class active:
        get_current_device = staticmethod(lambda: 0)
        get_current_stream = staticmethod(lambda device: 1234)


@pytest.fixture
def stand_in(monkeypatch):
    direct_launch.clear()
    monkeypatch.setattr(direct_launch, "_usable", lambda fn: True)
    monkeypatch.setattr(direct_launch, "_driver", Driver)
    yield Kernel()
    direct_launch.clear()


def kinds(kernel):
    return [c[0] for c in kernel.calls]


def test_the_second_launch_of_a_signature_goes_straight_to_the_launcher(stand_in) -> None:
    x = torch.zeros(64)
    direct_launch.launch(stand_in, (3,), x, 48, BLOCK=16, num_warps=4)
    direct_launch.launch(stand_in, (5, 2), x, 48, BLOCK=16, num_warps=4)  # another grid: the same signature
    assert kinds(stand_in) == ["triton", "direct"]
    args = stand_in.calls[1][1]
    # grid to three dimensions, the stream, the handles, metadata, the two hooks, then
    # every argument in the kernel's order, constexprs included (launch options not)
    assert args[:5] == (5, 2, 1, 1234, "fn-handle") and args[5] == "meta"
    assert args[6:9] == (None, None, None)  # no hooks set: no metadata, no hook calls
    assert args[-3:] == (x.data_ptr(), 48, 16)  # the tensor as its address: no pointer query in the launcher
    assert direct_launch.cached_signatures() == 1


def test_with_a_launch_hook_set_the_launcher_gets_the_tensors_and_their_metadata(stand_in, monkeypatch) -> None:
    """A profiler's launch hook (Proton, for one) reads the tensors from the metadata."""
    def hook(metadata) -> None:
        pass

    monkeypatch.setattr(Compiled, "launch_metadata", lambda self, grid, stream, *args: ("md", args))
    monkeypatch.setattr(direct_launch._knobs.runtime, "launch_enter_hook", hook)
    x = torch.zeros(64)
    for _ in range(2):
        direct_launch.launch(stand_in, (3,), x, 32, BLOCK=16)
    args = stand_in.calls[1][1]
    assert kinds(stand_in) == ["triton", "direct"]
    assert args[6] == ("md", (x, 32, 16)) and args[7] is hook
    assert args[-3] is x and args[-2:] == (32, 16)


@pytest.mark.parametrize("change", ["misaligned", "dtype", "int-class", "int-value", "int-one", "bool", "constexpr", "option"])
def test_anything_triton_specializes_on_takes_triton_s_path_again(stand_in, change) -> None:
    x = torch.zeros(64)
    base = dict(args=(x, 32), kwargs=dict(BLOCK=16, num_warps=4))
    other = {
        "misaligned": dict(args=(x[1:], 32), kwargs=base["kwargs"]),  # 4 bytes off 16-byte alignment
        "dtype": dict(args=(x.double(), 32), kwargs=base["kwargs"]),
        "int-class": dict(args=(x, 33), kwargs=base["kwargs"]),
        "int-value": dict(args=(x, 48), kwargs=base["kwargs"]),  # the same class as 32: keyed finer than Triton
        "int-one": dict(args=(x, 1), kwargs=base["kwargs"]),
        "bool": dict(args=(x, True), kwargs=base["kwargs"]),  # not the int 1, though True == 1 as a key
        "constexpr": dict(args=(x, 32), kwargs=dict(BLOCK=32, num_warps=4)),
        "option": dict(args=(x, 32), kwargs=dict(BLOCK=16, num_warps=8)),
    }[change]
    if change == "bool":  # the int 1 first: a bool must not find its entry
        base = dict(args=(x, 1), kwargs=base["kwargs"])
    direct_launch.launch(stand_in, (1,), *base["args"], **base["kwargs"])
    direct_launch.launch(stand_in, (1,), *other["args"], **other["kwargs"])
    direct_launch.launch(stand_in, (1,), *other["args"], **other["kwargs"])
    assert kinds(stand_in) == ["triton", "triton", "direct"]


def test_an_argument_it_cannot_classify_always_takes_triton_s_path(stand_in) -> None:
    for _ in range(2):
        direct_launch.launch(stand_in, (1,), torch.zeros(4), "n", BLOCK=16)
    assert kinds(stand_in) == ["triton", "triton"] and direct_launch.cached_signatures() == 0


def test_the_signature_table_is_emptied_when_full(stand_in, monkeypatch) -> None:
    monkeypatch.setattr(direct_launch, "MAX_SIGNATURES", 3)
    x = torch.zeros(64)
    for n in (16, 32, 48):
        direct_launch.launch(stand_in, (1,), x, n, BLOCK=16)
    assert direct_launch.cached_signatures() == 3
    direct_launch.launch(stand_in, (1,), x, 64, BLOCK=16)  # a fourth: the table starts again
    assert direct_launch.cached_signatures() == 1
    direct_launch.launch(stand_in, (1,), x, 64, BLOCK=16)
    direct_launch.launch(stand_in, (1,), x, 16, BLOCK=16)  # forgotten: Triton's path once more
    assert kinds(stand_in)[-2:] == ["direct", "triton"]


def test_an_entry_another_kernel_left_under_the_same_id_is_not_used(stand_in) -> None:
    """Kernels are keyed by id(); a freed kernel's id can come back on another one."""
    x, gone = torch.zeros(64), Kernel()
    direct_launch.launch(gone, (1,), x, 48, BLOCK=16)
    (key, entry), = direct_launch._COMPILED.items()
    direct_launch._COMPILED[(id(stand_in), *key[1:])] = entry  # as if `gone` had had stand_in's id
    direct_launch.launch(stand_in, (1,), x, 48, BLOCK=16)
    assert kinds(stand_in) == ["triton"] and kinds(gone) == ["triton"]


def test_a_kernel_missing_an_argument_is_not_cached(stand_in) -> None:
    for _ in range(2):  # BLOCK left to a default: the direct call could not rebuild the list
        direct_launch.launch(stand_in, (1,), torch.zeros(4), 8)
    assert kinds(stand_in) == ["triton", "triton"]


@pytest.mark.skipif(CUDA, reason="the interpreter's path")
def test_under_the_interpreter_nothing_is_cached() -> None:
    from kernels.ops.linear_act import linear_act

    direct_launch.clear()
    x, w, b = torch.randn(8, 5), torch.randn(6, 5, requires_grad=True), torch.randn(6)
    for _ in range(2):
        linear_act(x, w, b, "relu").sum().backward()
    assert direct_launch.cached_signatures() == 0


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_direct_launches_give_triton_s_bits(dtype) -> None:
    from kernels.ops.linear_act import linear_act

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(300, 75, device="cuda", generator=g).to(dtype)
    w = torch.randn(200, 75, device="cuda", generator=g, requires_grad=True)
    b = torch.randn(200, device="cuda", generator=g, requires_grad=True)

    def once():
        w.grad = b.grad = None
        y = linear_act(x, w.to(dtype), b.to(dtype), "silu")
        y.float().square().sum().backward()
        return [y.detach(), w.grad.clone(), b.grad.clone()]

    direct_launch.clear()
    first = once()  # Triton's path: every signature bound and cached
    assert direct_launch.cached_signatures() >= 3
    again = once()  # the direct path
    for a, c in zip(first, again):
        assert torch.equal(a, c)
