"""The shared trace reader (agent/traces.py): GenTD26 per-pod files and plain or gzip'd CSV."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.agent.traces import (
    GENTD26_DUTY_CYCLE_FILE,
    GenTD26Cells,
    GenTD26HeaderError,
    TraceError,
    gentd26_cells,
    gentd26_series,
    open_csv,
)

GENTD26 = Path(__file__).resolve().parents[2] / "shared" / "data" / "alibaba_gentd26"


def write(path: Path, text: str, *, gzipped: bool = False) -> Path:
    if gzipped:
        with gzip.open(path, "wt", encoding="utf-8", newline="") as file:
            file.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("gzipped", [False, True])
def test_open_csv_reads_plain_and_gzipped_files_alike(tmp_path: Path, gzipped: bool) -> None:
    # The name does not decide: gzip's magic bytes do.
    path = write(tmp_path / "trace.csv", "a,b\n1,2\n", gzipped=gzipped)
    with open_csv(path) as reader:
        assert list(reader) == [["a", "b"], ["1", "2"]]


def test_columns_are_found_by_name_in_any_order(tmp_path: Path) -> None:
    path = write(
        tmp_path / "memory.csv.gz",
        "timestamp_anon,value,container_ip\n60.0,12.0,ab\n0.0,7.5,cd\n57.0,1.0,ab\n",
        gzipped=True,
    )
    assert list(gentd26_cells(path)) == [
        GenTD26Cells(2, "12.0", "60.0", "ab"),
        GenTD26Cells(3, "7.5", "0.0", "cd"),
        GenTD26Cells(4, "1.0", "57.0", "ab"),
    ]
    # grouped by pod in the order of first appearance, rows in file order
    assert gentd26_series(path, float) == {"ab": [(60.0, 12.0), (57.0, 1.0)], "cd": [(0.0, 7.5)]}


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        ("time_seconds,gpu_uuid\n", GenTD26HeaderError, r":1: expected the columns value, "),
        ("", GenTD26HeaderError, r":1: expected the columns .* got \[\]"),
        ("value,timestamp_anon,container_ip\n1,2\n", TraceError, r":2: 2 cells, expected 3"),
        ("value,timestamp_anon,container_ip\nx,2,ab\n", TraceError, r":2: could not convert"),
        ("value,timestamp_anon,container_ip\n1,,ab\n", TraceError, r":2: could not convert"),
    ],
)
def test_bad_files_name_the_file_and_line(
    tmp_path: Path, text: str, error: type[Exception], message: str
) -> None:
    path = write(tmp_path / "bad.csv", text)
    with pytest.raises(error, match=message) as caught:
        gentd26_series(path, float)
    assert str(caught.value).startswith(str(path))


def test_the_reader_stays_in_the_standard_library() -> None:
    # The agent's base install has no numpy or pandas; the reader must not need them.
    code = (
        "import sys\n"
        "import gpuwarden.agent.traces\n"
        "heavy = {'numpy', 'pandas', 'gpuwarden.collector'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_the_real_duty_cycle_file() -> None:
    path = GENTD26 / GENTD26_DUTY_CYCLE_FILE
    if not path.is_file():
        pytest.skip(f"{path} is not here (the GenTD26 trace is shared, not in the repository)")
    series = gentd26_series(path, float)
    assert len(series) == 143  # pods, as the data README counts them
    assert sum(len(rows) for rows in series.values()) == 157_417
    assert all(0.0 <= value <= 100.0 for rows in series.values() for _, value in rows)
