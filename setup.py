"""Build hook for the one compiled module (the metadata is in pyproject.toml).

``dist_logging/stragglers/_csections.c`` is the hot path of section timing (see ``dist_logging/stragglers/_core.py``).
It is optional: without a C compiler, or off POSIX, or with ``DIST_LOGGING_NO_EXTENSIONS=1``, the install
goes on and the same classes run in Python.
"""

import os

from setuptools import Extension, setup

extensions = []
if os.name == 'posix' and os.environ.get('DIST_LOGGING_NO_EXTENSIONS', '').strip() in ('', '0'):
    extensions.append(Extension('dist_logging.stragglers._csections', ['dist_logging/stragglers/_csections.c'],
                                optional=True, extra_compile_args=['-O2']))

setup(ext_modules=extensions)
