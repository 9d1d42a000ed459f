"""Print a pip constraints file pinning every dependency of pyproject.toml (and of the
extras named on the command line) to the lowest release its bound allows, for CI's
lowest-version check. pip has no 'lowest' resolution of its own, hence this file.

torch is left to the install command: PyPI's older torch releases for Linux are CUDA
builds of several GB. Its lower bound and triton's are the pair the GPU machines run
(torch 2.11, triton 3.6); triton is pinned here like the rest, since a kernel that only
triton 3.6's compiler refuses passes every test on the newest release
(tests/test_mlp_step.py builds the fused step for sm_90 on the CPU). Needs `packaging`,
which pytest brings.
"""

import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

LEFT_TO_THE_INSTALL = {"torch"}


def lowest_pins(pyproject: Path, extras: list[str]) -> list[str]:
    """`name==lower` for each requirement with a `>=` bound whose marker holds here."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    pins: dict[str, str] = {}
    for line in lines:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        lower = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        if lower and requirement.name.lower() not in LEFT_TO_THE_INSTALL:
            pins[requirement.name.lower()] = lower[0]
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    print("\n".join(lowest_pins(root / "pyproject.toml", sys.argv[1:])))
