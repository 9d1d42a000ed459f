"""Trained models kept on disk: a configuration is trained once per dataset and profile.

The benchmark and the search ask for the same model many times; `trained_model` trains
it with model.train.Trainer the first time and keeps its weights in a file named by
`cache_path`, keyed by the configuration (seed and epochs included), the dataset's
contents (`dataset_fingerprint`) and the profile. A corrupt file is retrained.
"""

from __future__ import annotations

import hashlib
import io
import json
import warnings
from pathlib import Path

import torch

from model.config import TrainConfig
from model.data import Dataset
from kernels.ground.files import write_atomic
from model.mlp import MLP
from model.train import Trainer

CACHE_FORMAT = 1  # bump when what a cache file holds changes
_FINGERPRINTS: dict[int, tuple[Dataset, str]] = {}


def dataset_fingerprint(data: Dataset) -> str:
    """A digest of the split's contents (features, labels, classes): two datasets with the
    same frames give the same key, whatever their source string."""
    known = _FINGERPRINTS.get(id(data))
    if known is not None and known[0] is data:
        return known[1]
    digest = hashlib.sha256()
    for tensor in (data.x_train, data.y_train, data.x_test, data.y_test):
        array = tensor.detach().cpu().contiguous()
        digest.update(str((tuple(array.shape), str(array.dtype))).encode())
        digest.update(array.numpy().tobytes())
    digest.update("\n".join(data.classes).encode())
    _FINGERPRINTS[id(data)] = (data, digest.hexdigest())
    return _FINGERPRINTS[id(data)][1]


def cache_key(config: TrainConfig, data: Dataset, profile: str) -> dict[str, object]:
    """What a trained model depends on: the configuration (seed and epochs included), the
    dataset's contents and the profile."""
    return {"format": CACHE_FORMAT, "config": config.as_dict(), "dataset": dataset_fingerprint(data),
            "profile": profile}


def cache_path(config: TrainConfig, data: Dataset, profile: str, cache_dir: Path) -> Path:
    key = json.dumps(cache_key(config, data, profile), sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    return Path(cache_dir) / f"{profile}-d{config.depth}-w{config.width}-b{config.batch_size}-{digest}.pt"


def _build(config: TrainConfig, data: Dataset) -> MLP:
    return MLP(data.n_features, config.width, config.depth, data.n_classes, config.activation, "torch")


def trained_model(config: TrainConfig, data: Dataset, *, profile: str, cache_dir: Path) -> torch.nn.Module:
    """`config` trained on `data` (model.train.Trainer), from the disk cache when the same
    configuration, seed, dataset and profile were trained before; a corrupt cache file
    is retrained with a warning. Returns a fresh eager-torch MLP in eval mode on the
    data's device each call (callers may change theirs)."""
    if not isinstance(profile, str) or not profile:
        raise ValueError(f"trained_model: profile={profile!r}: expected a profile name")
    path = cache_path(config, data, profile, Path(cache_dir))
    key = cache_key(config, data, profile)
    if path.exists():
        try:
            stored = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(stored, dict) or stored.get("key") != json.dumps(key, sort_keys=True):
                raise ValueError("it holds another configuration's weights")
            model = _build(config, data)
            model.load_state_dict(stored["state_dict"])
            return model.to(data.device).eval()
        except Exception as exc:  # unreadable, truncated, foreign: never fatal, retrain
            warnings.warn(f"trained-model cache {path} could not be used ({exc}); retraining", stacklevel=2)
    trainer = Trainer(config, data)
    trainer.fit()
    state = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
    metrics = trainer.evaluate()
    trainer.release()
    _save(path, {"key": json.dumps(key, sort_keys=True), "state_dict": state,
                             "accuracy": metrics["accuracy"], "macro_f1": metrics["macro_f1"]})
    model = _build(config, data)
    model.load_state_dict(state)
    return model.to(data.device).eval()


def _save(path: Path, payload: dict[str, object]) -> None:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    write_atomic(path, buffer.getvalue())  # a crash or a parallel run never leaves half a file
