"""What the search varies: compression settings, and with --train-space the training
hyperparameters, as Optuna distributions.

The default space covers every weight format and sparsity the compression code knows;
a TOML file (`--space`) narrows or widens it. The space is checked whole before a study
starts, so a typo stops the command with one message naming the key, never a trial.

Sparsity is one categorical choice (`dense`, `unstructured`, `2:4`) with the pruned
fraction and the fine-tune epochs asked only where they mean something: a dense model
has nothing to prune or to recover from. 2:4 is searched with bf16 weights only, so
its weights are a parameter of their own (`weights_2:4`): an Optuna parameter keeps
one set of choices for the whole study. The hand-picked variants map onto the same
parameters (`preset_params`) so they enter the study as ordinary trials.
"""

from __future__ import annotations

import dataclasses
import random
import sys
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import optuna

from model.compress import WEIGHTS
from model.compress import Compression
from kernels.ground.axes import ACTIVATIONS
from model.config import OPTIMIZERS
from model.config import TrainConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the project supports 3.10 through tomli
    import tomli as tomllib

SPARSITY = ("dense", "unstructured", "2:4")
# model.compress also takes fp32 with 2:4, but PyTorch's default 2:4 backend (cuSPARSELt)
# refuses fp32 weights: on an H100 (torch 2.11) every fp32 2:4 trial of a 50-trial search
# came back unsupported, 4 trials spent on nothing.
SEMI_STRUCTURED_WEIGHTS = ("bf16",)
PRUNE_STEP = 0.05  # pruned fractions are searched in these steps: a front reads 0.65, not 0.6473
TRAIN_KEYS = {  # key: (kind, allowed values or None for positive integers)
    "depth": ("range", None),
    "width": ("choices", None),
    "batch_size": ("choices", None),
    "activation": ("choices", ACTIVATIONS),
    "optimizer": ("choices", OPTIMIZERS),
}
DEFAULT_TRAIN = {
    "depth": (2, 5),
    "width": (128, 256, 512, 1024, 2048),
    "activation": ACTIVATIONS,
}


class SpaceError(ValueError):
    """A search space that cannot be searched; the message names the key and the rule."""


@dataclass(frozen=True)
class Space:
    weights: tuple[str, ...] = WEIGHTS
    sparsity: tuple[str, ...] = SPARSITY
    prune_fraction: tuple[float, float] = (0.3, 0.95)  # unstructured: [low, high] of the pruned fraction
    finetune_epochs: tuple[int, int] = (0, 5)  # sparse models: [low, high]
    train: dict[str, tuple[Any, ...]] = field(default_factory=lambda: dict(DEFAULT_TRAIN))

    @property
    def weights_24(self) -> tuple[str, ...]:
        return tuple(w for w in self.weights if w in SEMI_STRUCTURED_WEIGHTS)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able; stored with the study so a resumed search searches the same space."""
        return {
            "weights": list(self.weights),
            "sparsity": list(self.sparsity),
            # derived, but an Optuna parameter of its own: a study made when 2:4 also took
            # fp32 must be refused at the start, not fail its first 2:4 trial
            "weights_2:4": list(self.weights_24),
            "prune_fraction": list(self.prune_fraction),
            "finetune_epochs": list(self.finetune_epochs),
            "train": {k: list(v) for k, v in self.train.items()},
        }


def load_space(path: Path | None) -> Space:
    """The default space, or the default with the keys a TOML file sets replaced.
    A `[train]` table replaces the default training space as a whole."""
    if path is None:
        return Space()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpaceError(f"--space {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpaceError(f"--space {path}: cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpaceError(f"--space {path}: not valid TOML: {exc}") from None
    try:
        return space_from_dict(data)
    except SpaceError as exc:
        raise SpaceError(f"--space {path}: {exc}") from None


def space_from_dict(data: dict[str, Any]) -> Space:
    known = {"weights", "sparsity", "prune_fraction", "finetune_epochs", "train"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise SpaceError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    changes: dict[str, Any] = {}
    if "weights" in data:
        changes["weights"] = _choices("weights", data["weights"], WEIGHTS)
    if "sparsity" in data:
        changes["sparsity"] = _choices("sparsity", data["sparsity"], SPARSITY)
    if "prune_fraction" in data:
        low, high = _range("prune_fraction", data["prune_fraction"], float)
        if not 0 < low <= high < 1:
            raise SpaceError(f"prune_fraction = {data['prune_fraction']!r}: need 0 < low <= high < 1")
        if any(abs(v / PRUNE_STEP - round(v / PRUNE_STEP)) > 1e-9 for v in (low, high)):
            raise SpaceError(f"prune_fraction = {data['prune_fraction']!r}: "
                             f"low and high must be multiples of {PRUNE_STEP}")
        changes["prune_fraction"] = (float(low), float(high))
    if "finetune_epochs" in data:
        low, high = _range("finetune_epochs", data["finetune_epochs"], int)
        if not 0 <= low <= high:
            raise SpaceError(f"finetune_epochs = {data['finetune_epochs']!r}: need 0 <= low <= high")
        changes["finetune_epochs"] = (low, high)
    if "train" in data:
        changes["train"] = _train(data["train"])
    space = dataclasses.replace(Space(), **changes)
    if "2:4" in space.sparsity and not space.weights_24:
        raise SpaceError(f"sparsity 2:4 needs weights {' or '.join(SEMI_STRUCTURED_WEIGHTS)} in the space; "
                         f"weights = {list(space.weights)!r}")
    return space


def _choices(key: str, value: Any, allowed: tuple[str, ...] | None, kind: type = str) -> tuple[Any, ...]:
    if not isinstance(value, list) or not value:
        raise SpaceError(f"{key} = {value!r}: expected a non-empty list")
    for item in value:
        if kind is int and (not isinstance(item, int) or isinstance(item, bool) or item < 1):
            raise SpaceError(f"{key} = {value!r}: {item!r} is not a positive integer")
        if kind is str and (not isinstance(item, str) or (allowed and item not in allowed)):
            raise SpaceError(f"{key} = {value!r}: {item!r} is not one of {', '.join(allowed or ())}")
    if len(set(value)) != len(value):
        raise SpaceError(f"{key} = {value!r}: a value is listed twice")
    return tuple(value)


def _range(key: str, value: Any, kind: type) -> tuple[Any, Any]:
    numeric = (int,) if kind is int else (int, float)
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(v, numeric) and not isinstance(v, bool) for v in value)):
        raise SpaceError(f"{key} = {value!r}: expected [low, high] ({kind.__name__})")
    return value[0], value[1]


def _train(table: Any) -> dict[str, tuple[Any, ...]]:
    if not isinstance(table, dict) or not table:
        raise SpaceError(f"train = {table!r}: expected a table of training hyperparameters")
    unknown = sorted(set(table) - set(TRAIN_KEYS))
    if unknown:
        raise SpaceError(f"train: unknown key(s) {', '.join(unknown)}; known: {', '.join(TRAIN_KEYS)}")
    out: dict[str, tuple[Any, ...]] = {}
    for key, value in table.items():
        kind, allowed = TRAIN_KEYS[key]
        if kind == "range":
            low, high = _range(f"train.{key}", value, int)
            if not 1 <= low <= high:
                raise SpaceError(f"train.{key} = {value!r}: need 1 <= low <= high")
            out[key] = (low, high)
        else:
            out[key] = _choices(f"train.{key}", value, allowed, str if allowed else int)
    return out


@dataclass(frozen=True)
class Setting:
    """One point of the space: the training configuration and the compression."""

    config: TrainConfig
    compression: Compression

    @property
    def label(self) -> str:
        return compression_label(self.compression)


def compression_label(compression: Compression) -> str:
    """Compression.name with the fine-tune epochs: 'prune-65+ft3', '2:4+ft4+bf16'."""
    name = compression.name
    if compression.finetune_epochs:
        name = name.replace("+ft", f"+ft{compression.finetune_epochs}", 1)
    return name


def suggest(trial: optuna.Trial, space: Space, base: TrainConfig, train_space: bool) -> Setting:
    """Ask the trial for one point of the space."""
    config = base
    if train_space:
        changes = {}
        for key, values in space.train.items():
            kind, _ = TRAIN_KEYS[key]
            changes[key] = (trial.suggest_int(key, *values) if kind == "range"
                            else trial.suggest_categorical(key, list(values)))
        config = base.replace(**changes)
    sparsity = trial.suggest_categorical("sparsity", list(space.sparsity))
    if sparsity == "2:4":
        weights = trial.suggest_categorical("weights_2:4", list(space.weights_24))
    else:
        weights = trial.suggest_categorical("weights", list(space.weights))
    fraction, finetune = 0.0, 0
    if sparsity == "unstructured":
        fraction = round(trial.suggest_float("prune_fraction", *space.prune_fraction, step=PRUNE_STEP), 4)
    if sparsity != "dense":
        finetune = trial.suggest_int("finetune_epochs", *space.finetune_epochs)
    compression = Compression(weights=weights, sparsity=fraction, semi_structured=sparsity == "2:4",
                              finetune_epochs=finetune)
    return Setting(config, compression)


class RandomDraw:
    """Stands in for an optuna.Trial in `suggest`, drawing each value uniformly from its
    range (on the range's steps) and keeping the parameters as Optuna would record them."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.params: dict[str, Any] = {}

    def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
        self.params[name] = self.rng.choice(choices)
        return self.params[name]

    def suggest_int(self, name: str, low: int, high: int) -> int:
        self.params[name] = self.rng.randint(low, high)
        return self.params[name]

    def suggest_float(self, name: str, low: float, high: float, *, step: float) -> float:
        self.params[name] = low + self.rng.randint(0, round((high - low) / step)) * step
        return self.params[name]


def random_point(rng: random.Random, space: Space, train_space: bool) -> dict[str, Any]:
    """The parameters of one point of the space drawn at random, conditional parameters
    included exactly where `suggest` asks for them."""
    draw = RandomDraw(rng)
    suggest(draw, space, TrainConfig(), train_space)  # type: ignore[arg-type]
    return draw.params


def preset_params(compression: Compression, space: Space, base: TrainConfig, train_space: bool) -> dict[str, Any] | str:
    """The trial parameters that reproduce a hand-picked variant (at the base training
    configuration), or the reason it lies outside the space."""
    params: dict[str, Any] = {}
    if train_space:
        for key, values in space.train.items():
            value = getattr(base, key)
            kind, _ = TRAIN_KEYS[key]
            inside = values[0] <= value <= values[1] if kind == "range" else value in values
            if not inside:
                return f"{key}={value} of the base configuration is outside train.{key}"
            params[key] = value
    kind = "2:4" if compression.semi_structured else "unstructured" if compression.sparsity else "dense"
    if kind not in space.sparsity:
        return f"sparsity {kind} is not in the space"
    choices = space.weights_24 if kind == "2:4" else space.weights
    if compression.weights not in choices:
        return f"weights {compression.weights} are not in the space"
    params["sparsity"] = kind
    params["weights_2:4" if kind == "2:4" else "weights"] = compression.weights
    if kind == "unstructured":
        low, high = space.prune_fraction
        if not low <= compression.sparsity <= high:
            return f"pruned fraction {compression.sparsity} is outside prune_fraction {[low, high]}"
        params["prune_fraction"] = compression.sparsity
    if kind != "dense":
        low, high = space.finetune_epochs
        if not low <= compression.finetune_epochs <= high:
            return f"{compression.finetune_epochs} fine-tune epochs are outside finetune_epochs {[low, high]}"
        params["finetune_epochs"] = compression.finetune_epochs
    return params
