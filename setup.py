# The C frame hook needs CPython's internal headers (Py_BUILD_CORE); nothing
# else about the build is special.
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "frametrace._C",
            sources=["frametrace/_C/evalframe.c", "frametrace/_C/guards.c"],
            depends=["frametrace/_C/guards.h"],
            extra_compile_args=["-O2", "-Wall", "-Wno-missing-field-initializers"],
        )
    ]
)
