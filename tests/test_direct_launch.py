"""kernels/runtime/direct_launch.py: Triton's binding once per launch signature, then the
compiled kernel's launcher. On a CPU with a stand-in kernel (the interpreter has no
compiled kernels); the GPU test runs the fused op both ways."""

from __future__ import annotations

import pytest
import torch

from kernels.runtime import direct_launch
from kernels.runtime import versions
from tests.devices import CUDA



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


@pytest.mark.parametrize("change", ["misaligned", "dtype", "int-class", "int-value", "int-one", "bool", "constexpr",
                                    "option"])
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


# ------------------------------------------------- the version gate and the public path


@pytest.mark.parametrize(
    ("text", "version"), [("3.6.0", (3, 6)), ("3.9.0+git1a2b3c", (3, 9)), ("2.13.0+cpu", (2, 13)), ("dev", (0, 0))]
)
def test_a_version_string_becomes_major_and_minor(text, version) -> None:
    assert versions.version_tuple(text) == version


def test_the_triton_shims_run_on_the_oldest_and_newest_triton_supported_only() -> None:
    assert versions.triton_internals_fit((3, 6))  # the GPU hosts'
    assert versions.triton_internals_fit((3, 9))  # this repository's CPU tests'
    assert (versions.triton_internals_fit(versions.TRITON_OLDEST)
            and versions.triton_internals_fit(versions.TRITON_NEWEST))
    assert not versions.triton_internals_fit((3, 5))
    assert not versions.triton_internals_fit((3, 10))
    assert not versions.triton_internals_fit((4, 0))


def test_torch_s_private_checks_run_on_the_torch_versions_they_were_made_for_only() -> None:
    assert versions.torch_internals_fit((2, 11)) and versions.torch_internals_fit((2, 13))
    assert not versions.torch_internals_fit((2, 0)) and not versions.torch_internals_fit((2, 14))


def test_with_the_shim_off_every_launch_takes_triton_s_path(monkeypatch) -> None:
    direct_launch.clear()
    monkeypatch.setattr(direct_launch, "ENABLED", False)
    monkeypatch.setattr(direct_launch, "_driver", Driver)
    kernel = Kernel()
    x = torch.zeros(4)
    for _ in range(3):
        direct_launch.launch(kernel, (1,), x, 4, BLOCK=16)
    assert [call[0] for call in kernel.calls] == ["triton"] * 3
    assert direct_launch.cached_signatures() == 0
    direct_launch.clear()


@pytest.mark.skipif(CUDA, reason="the interpreter's path")
def test_with_every_shim_off_the_op_gives_torch_s_results_through_public_apis(monkeypatch) -> None:
    from kernels.ops import linear_act as op
    from kernels.runtime import torch_internals

    monkeypatch.setattr(direct_launch, "ENABLED", False)
    monkeypatch.setattr(op, "in_dispatch_mode", torch_internals._public_in_dispatch_mode)  # the op path
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 5, generator=g)
    w = torch.randn(6, 5, generator=g, requires_grad=True)
    b = torch.randn(6, generator=g, requires_grad=True)
    op.linear_act(x, w, b, "tanh").sum().backward()
    w2, b2 = w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    torch.tanh(torch.nn.functional.linear(x, w2, b2)).sum().backward()
    assert torch.allclose(w.grad, w2.grad, atol=1e-5) and torch.allclose(b.grad, b2.grad, atol=1e-5)


def test_the_public_fallbacks_of_torch_s_private_checks_err_on_the_safe_side() -> None:
    from kernels.runtime import torch_internals

    assert torch_internals._public_in_dispatch_mode()  # always the registered op, which every mode sees
    assert not torch_internals._public_is_fake(torch.zeros(1))
    assert not torch_internals._public_is_fake(torch.nn.Parameter(torch.zeros(1)))

    class Traced(torch.Tensor):
        pass

    assert torch_internals._public_is_fake(torch.zeros(1).as_subclass(Traced))  # not timed: the heuristic tile
