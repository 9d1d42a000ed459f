import pytest
import torch

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def cuda_only(reason: str = "needs a CUDA GPU") -> pytest.MarkDecorator:
    return pytest.mark.skipif(not torch.cuda.is_available(), reason=reason)
