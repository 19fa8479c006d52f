"""The warm-start options of ``remote_write:``: safe defaults, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.agent.config import ConfigError
from gpuwarden.collector.config import load_collector_config

WRITE = "remote_write:\n  url: http://127.0.0.1:8428/api/v1/write\n"


def load(tmp_path: Path, text: str):
    path = tmp_path / "collector.yaml"
    path.write_text(text)
    return load_collector_config(path)


def test_no_read_back_unless_asked(tmp_path: Path) -> None:
    settings = load(tmp_path, WRITE).remote_write
    assert settings is not None
    assert settings.read_url is None
    assert settings.read_api == "victoriametrics"
    assert settings.warm_start_lookback_seconds == 6 * 3600
    assert settings.warm_start_long_lookback_seconds == 14 * 86400


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("  read_url: victoria:8428\n", "remote_write.read_url: an http:// or https:// URL"),
        ("  read_url: http://v:8428/api/v1/export\n", "remote_write.read_url: the TSDB's base URL"),
        (
            "  read_url: http://v:8428\n  read_api: influx\n",
            "remote_write.read_api: expected one of",
        ),
        ("  warm_start_lookback_seconds: -1\n", "remote_write.warm_start_lookback_seconds"),
        ("  read_max_samples: 0\n", "remote_write.read_max_samples"),
    ],
)
def test_a_bad_option_is_one_clear_error(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load(tmp_path, WRITE + extra)
    assert str(tmp_path / "collector.yaml") in str(caught.value)
