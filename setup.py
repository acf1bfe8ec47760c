"""The optional compiled hot path (starvewatch/_ccore.c; issue 29). Everything else about the
package is in pyproject.toml.

`optional=True`: where it cannot be built (no compiler, an unusual platform) the install goes
on without it and starvewatch runs its pure-Python hot path (starvewatch/hooks/core.py). Not
built on PyPy, nor on a free-threaded CPython (its fast path relies on the GIL)."""
import platform
import sysconfig

from setuptools import Extension, setup

ext_modules = []
if platform.python_implementation() == "CPython" and not sysconfig.get_config_var("Py_GIL_DISABLED"):
    ext_modules.append(Extension("starvewatch._ccore", ["starvewatch/_ccore.c"], optional=True))

setup(ext_modules=ext_modules)
