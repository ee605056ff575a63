"""Build of mmscope's one C library; everything else about the package is in pyproject.toml.

`_nvtx_inject` is the NVTX injection library of `mmscope record`, loaded by NVTX itself through
NVTX_INJECTION64_PATH (nothing else can capture NVTX calls without Nsight Systems).
"""
import platform
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildExt(build_ext):
    """Adds -mtls-dialect=gnu2 where the compiler takes it: the recorder reads a thread-local
    pointer twice per range, and TLS descriptors make that a load instead of a __tls_get_addr call
    in a dlopen'ed library."""

    def build_extensions(self):
        if platform.machine() in ("x86_64", "AMD64") and self._accepts("-mtls-dialect=gnu2"):
            for ext in self.extensions:
                ext.extra_compile_args.append("-mtls-dialect=gnu2")
        super().build_extensions()

    def _accepts(self, flag):
        import os
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "probe.c")
            with open(src, "w") as f:
                f.write("static __thread int x; int probe(void) { return x; }\n")
            try:
                self.compiler.compile([src], output_dir=tmp, extra_postargs=[flag, "-fPIC"])
            except Exception:
                return False
        return True


COMMON = ["-O2", "-fvisibility=hidden", "-Wall"]
# Linux is what the recorder is written for; elsewhere a failed build leaves `mmscope record`
# unavailable (it says so) and the writer on plain SQLite inserts, but the package installs.
OPTIONAL = not sys.platform.startswith("linux")

setup(
    ext_modules=[
        Extension(
            "mmscope.record._nvtx_inject",
            sources=["src/mmscope/record/nvtx_inject.c"],
            extra_compile_args=list(COMMON),
            extra_link_args=["-lpthread"],
            optional=OPTIONAL,
        ),
    ],
    cmdclass={"build_ext": BuildExt},
)
