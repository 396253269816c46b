# Only the native extension lives here; everything else is in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["native/build_rq.py:ffibuilder"])
