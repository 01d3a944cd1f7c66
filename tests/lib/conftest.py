import pytest
import torch


@pytest.fixture(autouse=True)
def _torch_validates_distribution_arguments():
    """torch's distributions validate their arguments by default, but torch._dynamo turns that
    off for the whole process the first time anything compiles (its TorchPatcher): the tests here
    compare holoflow's distributions with torch's default, whatever ran before them."""
    dist = torch.distributions.Distribution
    was = dist._validate_args
    dist.set_default_validate_args(True)
    yield
    dist.set_default_validate_args(was)
