"""The one compiled part: core/_fast.c, the eager per-op path (core/dispatch.py falls back to its
Python reference where the extension could not be built: ``optional=True``)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("holoflow.core._fast", ["src/holoflow/core/_fast.c"],
                             extra_compile_args=["-O2"], optional=True)])
