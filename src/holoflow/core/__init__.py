"""The core: dtype, device, Tensor, the op registry, dispatch and the autograd engine (see docs/architecture.md)."""
