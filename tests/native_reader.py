"""The compiled remote-write reader in tests: present, or skipped with the reason, or a
failure where ``GPUWARDEN_REQUIRE_NATIVE=1`` (``scripts/test.sh`` sets it: CI installs
protobuf-c, so the reader must have been built there)."""

from __future__ import annotations

import os

import pytest

from gpuwarden.collector.remote_write import wire_flat

REQUIRED = os.environ.get("GPUWARDEN_REQUIRE_NATIVE") == "1"


def require_native() -> wire_flat.NativeReader:
    """The compiled reader (skips or fails the test without it)."""
    found = wire_flat.native_reader()
    if found is None:
        if REQUIRED:
            pytest.fail("GPUWARDEN_REQUIRE_NATIVE=1 but the compiled reader is not built")
        pytest.skip("the compiled reader is not built (protobuf-c is not installed)")
    return found


@pytest.fixture(params=[False, True], ids=["python-read", "native-read"])
def native(request: pytest.FixtureRequest) -> bool:
    """Each decoder's read: in Python (``wire_flat``), then compiled (``native/rwflat.c``)."""
    if request.param:
        require_native()
    return bool(request.param)
