"""The run profiles (how much data, how many epochs) and where the default budgets live."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Profile:
    name: str
    scale: float  # fraction of the dataset's frames
    epochs: int  # the first is the warm-up; every later epoch is one pytest-benchmark round
    about: str


PROFILES = {
    "smoke": Profile("smoke", 0.1, 8, "10% of the frames, 8 epochs: the CPU check of every code path"),
    "quick": Profile("quick", 1.0, 40, "all frames, 40 epochs: accuracy budgets mean something"),
    "thesis": Profile("thesis", 1.0, 400, "all frames, the study's 400 epochs"),
}
TIERS = ("pr", "nightly")  # the nightly tier is every case; the pr tier leaves out cases marked nightly
DEFAULT_BUDGETS = Path(__file__).resolve().parents[1] / "budgets.toml"
