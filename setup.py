"""The one compiled part: core/_fast.c, the eager per-op path and the backward loop. Optional:
where it cannot be built (no C compiler), the install goes on and core/dispatch.py and
core/autograd.py run their Python reference."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("holoflow.core._fast", ["src/holoflow/core/_fast.c"], optional=True)])
