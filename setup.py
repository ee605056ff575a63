"""Build of mmscope's C libraries; everything else about the package is in pyproject.toml.

Three are loaded with dlopen/ctypes, not imported: `_nvtx_inject` is the NVTX injection library of
`mmscope record`, `_sqlite_pages` writes the recorded NVTX table straight into SQLite pages,
`_analysis_kernels` holds the analyzer's hot loops (optional everywhere: without it the analyzer
takes its numpy road). `_chrome_format` is a Python extension module: the chrome tracing
backend's event formatter (optional too: chrome.py formats the same bytes in Python). So is
`_wrappers`: the hook wrappers' mechanics (optional: patching.py has the same wrappers in Python),
and `_step_telemetry`: the per-step telemetry observer (optional: telemetry.py does the same).
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
        Extension(
            "mmscope.record._sqlite_pages",
            sources=["src/mmscope/record/sqlite_pages.c"],
            extra_compile_args=list(COMMON),
            extra_link_args=["-lm"],
            optional=OPTIONAL,
        ),
        Extension(
            "mmscope.tracing._chrome_format",
            sources=["src/mmscope/tracing/_chrome_format.c"],
            extra_compile_args=list(COMMON),
            optional=True,
        ),
        Extension(
            "mmscope.vllm._wrappers",
            sources=["src/mmscope/vllm/_wrappers.c"],
            extra_compile_args=list(COMMON),
            optional=True,
        ),
        Extension(
            "mmscope.vllm._step_telemetry",
            sources=["src/mmscope/vllm/_step_telemetry.c"],
            extra_compile_args=list(COMMON),
            optional=True,
        ),
        Extension(
            "mmscope.analysis._analysis_kernels",
            sources=["src/mmscope/analysis/_analysis_kernels.c"],
            extra_compile_args=list(COMMON),
            optional=True,
        ),
    ],
    cmdclass={"build_ext": BuildExt},
)
