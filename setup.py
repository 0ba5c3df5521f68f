# The C frame hook needs CPython's internal headers (Py_BUILD_CORE).  Three optional C++
# modules are built against the installed torch's headers when they and a C++
# compiler are found, and skipped otherwise: the tensor guard's reads
# (frametrace._tensor_reads; without it guards read tensors through Python's getters),
# the eager backend's view chains (frametrace._views; without it each view op runs)
# and the triton backend's launch keys (frametrace._launch_keys; without it they are
# computed in Python).  Slower without them, never different.
import os
import re
import site
import sys
import sysconfig

from setuptools import Extension, setup


def torch_dir():
    """The installed torch package's directory, found without importing torch (pip's
    isolated build environment hides the environment's packages from sys.path, not
    from its install paths)."""
    paths = [sysconfig.get_paths()[k] for k in ("purelib", "platlib")]
    paths += [*site.getsitepackages(), *sys.path]
    for p in paths:
        d = os.path.join(p, "torch")
        if os.path.exists(os.path.join(d, "include", "torch", "csrc", "autograd", "python_variable.h")):
            return d
    return None


def torch_extensions():
    d = torch_dir()
    if d is None or os.environ.get("FRAMETRACE_NO_CXX"):
        return []
    with open(os.path.join(d, "version.py")) as f:
        version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", f.read(), re.M)
    if version is None:
        return []
    # torch 2.14's headers need C++20 (concepts, <compare>); older ones build as C++17.
    major_minor = tuple(int(n) for n in re.findall(r"\d+", version.group(1))[:2])
    std = "-std=c++20" if major_minor >= (2, 14) else "-std=c++17"
    inc = os.path.join(d, "include")
    lib = os.path.join(d, "lib")
    return [Extension(
        f"frametrace.{name}",
        sources=[f"frametrace/_C/{source}"],
        depends=depends,
        language="c++",
        define_macros=[("FT_TORCH_VERSION", '"%s"' % version.group(1))],
        # -isystem: torch's headers warn under -Wall; ours should not.
        extra_compile_args=["-O2", std, "-Wall", "-isystem", inc,
                            "-isystem", os.path.join(inc, "torch", "csrc", "api", "include")],
        library_dirs=[lib],
        libraries=["torch_python", "torch_cpu", "c10"],
        runtime_library_dirs=[lib],
        optional=True,
    ) for name, source, depends in (
        ("_tensor_reads", "tensor_reads.cpp",
         ["frametrace/_C/tensor_reads.h", "frametrace/_C/plain_tensor.h"]),
        ("_views", "views.cpp", ["frametrace/_C/plain_tensor.h"]),
        ("_launch_keys", "launch_keys.cpp", ["frametrace/_C/plain_tensor.h"]),
    )]


setup(
    ext_modules=[
        Extension(
            "frametrace._C",
            sources=["frametrace/_C/evalframe.c", "frametrace/_C/guards.c"],
            depends=["frametrace/_C/guards.h", "frametrace/_C/tensor_reads.h"],
            extra_compile_args=["-O2", "-Wall", "-Wno-missing-field-initializers"],
        ),
        *torch_extensions(),
    ]
)
