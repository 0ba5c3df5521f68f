"""Settings read while tracing and compiling.  Change them as module attributes.

>>> import frametrace
>>> frametrace.config.cache_size_limit = 16
"""

# Compiled entries kept per code object; past it the frame runs in CPython on a miss.
cache_size_limit = 8

# Packages whose frames are never traced (unless reached by inlining): torch itself,
# frametrace, and libraries with no torch program to capture.  The standard library
# is always skipped.
skip_packages = ("torch", "functorch", "frametrace", "sympy", "bytecode", "rich", "numpy",
                 "triton", "_pytest", "pluggy", "typing_extensions")
