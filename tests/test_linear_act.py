"""The eager path of the fused linear + activation op (kernels/ops/linear_act.py), on CPU:
the same bits as the op, and out of the way of dispatch modes and fake tensors."""

from __future__ import annotations

import pytest
import torch

from kernels.ops import linear_act as op
from kernels.ops.linear_act import linear_act
from kernels.plan import launch_plan
from tests.plans import layer

pytestmark = pytest.mark.usefixtures("launches")  # an empty cache of its own, no plans left behind


def _grads(fn, x, w, b, autocast=False):
    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    # fp16: Triton's interpreter does not support bf16 dots (triton-lang/triton#11584)
    with torch.autocast("cpu", torch.float16, enabled=autocast):
        y = fn(x, w, b)
    y.float().pow(2).sum().backward()
    return y, [y.detach(), x.grad, w.grad, b.grad]


@pytest.mark.interpreter
@pytest.mark.parametrize(("activation", "autocast"), [("silu", False), ("tanh", True)])
def test_the_eager_path_skips_the_op_and_gives_the_same_bits(activation, autocast) -> None:
    code = launch_plan.ACTIVATION_CODES[activation]
    x, w, b = layer()
    y, eager = _grads(lambda x, w, b: linear_act(x, w, b, activation), x, w, b, autocast)
    # Under autocast the eager path hands the kernels a 16-bit X and the fp32 W and b; the
    # op given the same tensors runs the same kernels (its registered autocast rule would
    # cast all three, to bf16).
    cast = (lambda t: t.half()) if autocast else (lambda t: t)  # noqa: E731
    z, via_op = _grads(lambda x, w, b: op.linear_act_fwd(cast(x), w, b, code)[0], x, w, b)
    assert type(y.grad_fn).__name__ == "_EagerLinearActBackward" and "loadbench" in type(z.grad_fn).__name__
    assert y.dtype == (torch.float16 if autocast else torch.float32) and eager[2].dtype == torch.float32
    for name, a, c in zip(("y", "dx", "dw", "db"), eager, via_op):
        assert a.dtype == c.dtype and torch.equal(a, c), name


def test_the_eager_path_steps_aside_for_dispatch_modes_and_fake_tensors() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x, w, b = layer()
    assert op._eager(x, w, b)
    with Passthrough():
        assert not op._eager(x, w, b)
    with FakeTensorMode() as mode:
        assert not op._eager(mode.from_tensor(x), w, b)
