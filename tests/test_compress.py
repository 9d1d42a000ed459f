"""Compression math on CPU: validation, names, exact pruning fractions, the 2:4 pattern,
bf16 casts, the input model left alone, and the reasons a variant cannot run."""

from __future__ import annotations

import pytest
import torch

from model.compress import VARIANTS
from model.compress import Compression
from model.compress import Served
from model.compress import Unsupported
from model.compress import compress
from model.compress import linear_layers
from model.compress import two_four_mask
from model.compress import unsupported_reason
from model.config import TrainConfig
from model.mlp import MLP

CPU = torch.device("cpu")


@pytest.fixture
def model():
    torch.manual_seed(0)
    return MLP(75, 64, 2, 10)


CONFIG = TrainConfig(width=64, depth=2, epochs=1, loop="fast")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"weights": "int4"}, "weights"),
        ({"sparsity": 1.0}, "sparsity"),
        ({"sparsity": -0.1}, "sparsity"),
        ({"sparsity": True}, "sparsity"),
        ({"semi_structured": 1}, "semi_structured"),
        ({"finetune_epochs": -1}, "finetune_epochs"),
        ({"finetune_epochs": 1.5}, "finetune_epochs"),
        ({"semi_structured": True, "sparsity": 0.5}, "semi_structured"),
        ({"semi_structured": True, "weights": "int8-weight"}, "semi_structured"),
    ],
)
def test_bad_compression_names_its_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"Compression\.{field}="):
        Compression(**kwargs)


def test_names():
    assert Compression().name == "fp32"
    assert Compression(weights="bf16").name == "bf16"
    assert Compression(sparsity=0.75, finetune_epochs=2).name == "prune-75+ft"
    assert Compression(weights="bf16", semi_structured=True).name == "2:4+bf16"
    assert set(VARIANTS) == {"fp32", "bf16", "fp8", "int8-weight", "int8-dynamic", "sparse-2:4",
                             "prune-50", "prune-75", "prune-90"}
    assert all(VARIANTS[f"prune-{p}"].finetune_epochs > 0 for p in (50, 75, 90))


@pytest.mark.parametrize("sparsity", [0.5, 0.75, 0.9])
def test_pruning_fraction_is_exact_per_layer(model, data, sparsity):
    served = compress(model, Compression(sparsity=sparsity), data, CONFIG)
    for _, layer in linear_layers(served.network):
        zeros = int((layer.weight == 0).sum())
        assert zeros == round(sparsity * layer.weight.numel())
        assert not hasattr(layer, "weight_mask")  # made permanent


def test_finetune_keeps_pruned_weights_at_zero(model, data):
    served = compress(model, Compression(sparsity=0.75, finetune_epochs=2), data, CONFIG)
    layer = served.network.hidden[0]
    assert int((layer.weight == 0).sum()) == round(0.75 * layer.weight.numel())
    assert any("fine-tuned 2 epoch(s)" in note for note in served.notes)


def test_input_model_is_not_changed(model, data):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    compress(model, Compression(sparsity=0.9, finetune_epochs=1), data, CONFIG)
    compress(model, Compression(weights="bf16"), data, CONFIG)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_two_four_mask_keeps_the_two_largest_of_every_four():
    torch.manual_seed(1)
    weight = torch.randn(64, 128)
    mask = two_four_mask(weight)
    groups = mask.reshape(64, 32, 4)
    assert bool((groups.sum(-1) == 2).all())
    magnitudes = weight.abs().reshape(64, 32, 4)
    kept_min = magnitudes.masked_fill(~groups, float("inf")).min(-1).values
    dropped_max = magnitudes.masked_fill(groups, -1.0).max(-1).values
    assert bool((kept_min >= dropped_max).all())
    with pytest.raises(ValueError, match="multiple of 4"):
        two_four_mask(torch.randn(8, 6))


def test_bf16_casts_weights_and_serves_fp32(model, data):
    served = compress(model, Compression(weights="bf16"), data, CONFIG)
    assert isinstance(served, Served)
    assert all(p.dtype == torch.bfloat16 for p in served.network.parameters())
    out = served(data.x_test[:4])
    assert out.dtype == torch.float32 and out.shape == (4, 10)
    reference = model.eval()(data.x_test[:4])
    assert torch.allclose(out, reference, atol=0.1, rtol=0.05)


def test_reasons_a_variant_cannot_run_on_cpu():
    assert "sm_89" in unsupported_reason(VARIANTS["fp8"], CPU)
    assert "CUDA" in unsupported_reason(VARIANTS["sparse-2:4"], CPU)
    assert unsupported_reason(VARIANTS["fp32"], CPU) is None
    assert unsupported_reason(VARIANTS["prune-90"], CPU) is None


def test_unsupported_is_raised_with_the_reason(model, data):
    with pytest.raises(Unsupported, match="2:4 sparse kernels need a CUDA GPU"):
        compress(model, VARIANTS["sparse-2:4"], data, CONFIG)


def test_torchao_int8_when_installed(model, data, monkeypatch):
    pytest.importorskip("torchao", reason="torchao not installed: int8 variants are skipped by the bench")
    for weights in ("int8-weight", "int8-dynamic"):
        served = compress(model, Compression(weights=weights), data, CONFIG)
        out = served(data.x_test[:8])
        assert out.shape == (8, 10) and torch.isfinite(out).all()
        assert any("through torchao" in note for note in served.notes)


def test_missing_torchao_is_a_reason(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_torchao(name, *args, **kwargs):
        if name == "torchao" or name.startswith("torchao."):
            raise ImportError("No module named 'torchao'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchao)
    assert "needs torchao" in unsupported_reason(VARIANTS["int8-weight"], CPU)


def test_not_a_compression_is_one_clear_error(model, data):
    with pytest.raises(TypeError, match="must be a Compression"):
        compress(model, "bf16", data, CONFIG)  # type: ignore[arg-type]
