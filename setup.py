"""The one compiled part: the collector's remote-write reader (``native/rwflat.c``).

Everything else is in ``pyproject.toml``. The extension is optional: it needs ``protoc-c``,
protobuf-c's headers and library, and xxHash's header (Debian: ``protobuf-c-compiler
libprotobuf-c-dev libxxhash-dev``, which ``scripts/system-packages.sh`` installs). Without them
the install goes on and the collector reads remote-write in Python (``remote_write.wire_flat``),
slower, with the same answers.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = Path("native")
PROTO = NATIVE / "rwflat.proto"


class BuildNative(build_ext):
    """Generates the protobuf-c code for ``rwflat.proto`` first, or leaves the extension out
    (saying why) when protobuf-c is not installed."""

    def run(self) -> None:
        protoc = shutil.which("protoc-c")
        headers = (Path("/usr/include/protobuf-c/protobuf-c.h"), Path("/usr/include/xxhash.h"))
        if protoc is None or not all(header.exists() for header in headers):
            print(
                "gpuwarden: protoc-c, protobuf-c's or xxHash's headers missing (Debian: "
                "protobuf-c-compiler libprotobuf-c-dev libxxhash-dev); the remote-write reader "
                "stays in Python",
                file=sys.stderr,
            )
            self.extensions = []
            return
        generated = Path(self.build_temp) / "rwflat-gen"
        generated.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [protoc, f"--c_out={generated}", f"--proto_path={NATIVE}", str(PROTO)], check=True
        )
        for ext in self.extensions:
            ext.sources.append(str(generated / "rwflat.pb-c.c"))
            ext.include_dirs.append(str(generated))
        super().run()


setup(
    ext_modules=[
        Extension(
            "gpuwarden.collector.remote_write._rwflat",
            sources=[str(NATIVE / "rwflat.c")],
            libraries=["protobuf-c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ],
    cmdclass={"build_ext": BuildNative},
)
