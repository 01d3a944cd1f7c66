"""``nn.utils.convert_parameters``: torch's module name for ``parameters_to_vector`` and
``vector_to_parameters`` (defined in :mod:`.convert`)."""
from .convert import parameters_to_vector, vector_to_parameters

__all__ = ["parameters_to_vector", "vector_to_parameters"]
