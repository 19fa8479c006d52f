"""Fixtures: the fake NVML library (see fake_nvml.c), loaded into the real pynvml.

- ``fake_nvml_dir`` / ``fake_nvml_mismatch_dir`` (session): a directory holding the compiled
  ``libnvidia-ml.so.1``, for ``LD_LIBRARY_PATH`` in subprocess tests.
- ``fake_nvml`` / ``fake_nvml_mismatch`` (function): the library preset as ``pynvml.nvmlLib``,
  reset to eight GPUs with distinct values, as a :class:`FakeNvml` controller. On teardown NVML is
  shut down and pynvml's module globals are restored.
"""

from __future__ import annotations

import ctypes
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.fakenvml.control import FakeNvml, build_fake_nvml

_GPUS = 8
# dlopen() hands back the same mapping for the same path, so one CDLL per library is enough.
_loaded: dict[Path, ctypes.CDLL] = {}


def _build(tmp_path_factory: pytest.TempPathFactory, variant: str) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed: cannot compile the fake libnvidia-ml.so.1")
    return build_fake_nvml(tmp_path_factory.mktemp(f"fakenvml-{variant}"), variant=variant).parent


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory with the full fake ``libnvidia-ml.so.1``."""
    return _build(tmp_path_factory, "full")


@pytest.fixture(scope="session")
def fake_nvml_mismatch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory with a fake that lacks nvmlDeviceGetComputeRunningProcesses_v3."""
    return _build(tmp_path_factory, "no-processes-v3")


@contextmanager
def loaded_into_pynvml(library_path: Path, n_gpus: int = _GPUS) -> Iterator[FakeNvml]:
    """Preset ``library_path`` as pynvml's NVML library for the duration of the block."""
    import pynvml

    library = _loaded.get(library_path)
    if library is None:
        library = _loaded[library_path] = ctypes.CDLL(str(library_path))
    saved_lib = pynvml.nvmlLib
    saved_cache = dict(pynvml._nvmlGetFunctionPointer_cache)
    saved_refcount = pynvml._nvmlLib_refcount
    pynvml.nvmlLib = library
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml._nvmlLib_refcount = 0
    fake = FakeNvml(library, library_path)
    fake.reset(n_gpus)
    try:
        yield fake
    finally:
        fake.clear_errors()
        for _ in range(fake.init_refcount):
            library.nvmlShutdown()
        pynvml.nvmlLib = saved_lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(saved_cache)
        pynvml._nvmlLib_refcount = saved_refcount


@pytest.fixture
def fake_nvml(fake_nvml_dir: Path) -> Iterator[FakeNvml]:
    """The fake NVML (eight GPUs) loaded into the real pynvml."""
    with loaded_into_pynvml(fake_nvml_dir / "libnvidia-ml.so.1") as fake:
        yield fake


@pytest.fixture
def fake_nvml_mismatch(fake_nvml_mismatch_dir: Path) -> Iterator[FakeNvml]:
    """Like ``fake_nvml`` but an older library: no nvmlDeviceGetComputeRunningProcesses_v3."""
    with loaded_into_pynvml(fake_nvml_mismatch_dir / "libnvidia-ml.so.1") as fake:
        yield fake
