from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from model.data import Dataset
from model.data import load_dataset
from model.data import synthesize
from model.data import write_csv

pytest_plugins = ["pytester"]

# Under pytest-xdist (`pytest -n 2`) each worker shares the machine's cores with the
# others: one torch thread pool per worker sized to its share keeps them from spinning
# against each other.
_WORKERS = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
if _WORKERS and _WORKERS.isdigit() and int(_WORKERS) > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(_WORKERS)))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _not_an_xdist_worker() -> Iterator[None]:
    """The pytest runs a test starts (pytester, subprocesses) are sessions of their own, not
    xdist workers: pytest-benchmark disables itself where PYTEST_XDIST_WORKER is set. Session
    scope, so the module-scoped fixtures that start runs see it too."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
            patch.delenv(name, raising=False)
        # None of the pytest processes the tests start uses hypothesis, whose plugin imports
        # it at the end of every session. (Bytecode stays as the environment says: tests
        # that check out commits rewrite sources within a second, and a cached .pyc of
        # another commit's same-sized file would be read as current.)
        patch.setenv("PYTEST_ADDOPTS", f"{os.environ.get('PYTEST_ADDOPTS', '')} -p no:hypothesispytest".strip())
        yield


@pytest.fixture(scope="session")
def inprocess_ready() -> None:
    """Loads what a training run loads once per process, before any test's pytester takes
    its snapshot of sys.modules: pytester drops the modules a test imported when it ends,
    and a second import of torch._dynamo or triton aborts the process."""
    import torch._dynamo  # noqa: F401
    import torch.profiler  # noqa: F401
    import triton  # noqa: F401

    try:  # dropped after a test, its finder stays on sys.meta_path and hides entry points
        import importlib_metadata  # noqa: F401
    except ImportError:
        pass


@pytest.fixture(scope="module")
def data(request: pytest.FixtureRequest) -> Dataset:
    """The embedded synthetic data, split, loaded once per module: at the module's
    DATA_SCALE (0.02 unless it sets one), on its DATA_DEVICE (the CPU unless it sets one)."""
    return load_dataset("synthetic", scale=getattr(request.module, "DATA_SCALE", 0.02),
                        device=getattr(request.module, "DATA_DEVICE", "cpu"))


@pytest.fixture(scope="session")
def tiny_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small CSV of the synthetic data, for the runs a test starts with --dataset."""
    return write_csv(synthesize(scale=0.02), tmp_path_factory.mktemp("data") / "tiny.csv")


@pytest.fixture
def launches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """kernels.plan.launches with an empty tuning cache in the test's own folder, the
    default tuning mode and no plans or forced tiles; none left behind for the next test."""
    from kernels.plan import launches  # triton: loaded by the tests that launch kernels only

    monkeypatch.setenv("LOADBENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LOADBENCH_TUNE", raising=False)
    launches.reset_launch_state()
    yield launches
    from kernels.plan.trials import FORCED

    FORCED.clear()
    launches.reset_launch_state()


# The root conftest picks Triton's interpreter only where there is no GPU, and Triton reads
# that choice once, at its import: on a GPU host a kernel launched on CPU tensors fails.
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The slow tests first (a stable sort): pytest-xdist hands tests out in this order, so
    # the longest start early instead of leaving one worker busy at the end.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if not torch.cuda.is_available():
        no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(no_gpu)
        return
    if INTERPRETING:
        return
    skip = pytest.mark.skip(reason="Triton kernels on CPU tensors: on a GPU host run these with "
                                   "TRITON_INTERPRET=1 pytest tests/ -m interpreter")
    for item in items:
        if item.get_closest_marker("interpreter"):
            item.add_marker(skip)
