"""The PostgreSQL backend's own edges, against a real server (``tests.postgres_server``):
chosen by ``database: postgresql://...``, the password from a file or ``PGPASSWORD`` and never
shown, one-line errors when the server is unreachable or refuses us, reconnecting after the
server dropped us. (Everything the backends share runs on both in ``test_storage.py``.)"""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from gpuwarden.collector.build import open_storage
from gpuwarden.collector.config import CollectorConfig, ConfigError, load_collector_config
from gpuwarden.collector.storage.base import StorageError
from gpuwarden.collector.storage.migrations import LATEST_VERSION
from gpuwarden.collector.storage.postgres import PostgresStorage
from gpuwarden.collector.storage.records import ModelDeployment
from gpuwarden.collector.storage.sqlite import SqliteStorage
from gpuwarden.collector.storage.urls import redact_url
from tests.collector_server import free_port
from tests.postgres_server import PASSWORD, PASSWORD_USER, PostgresServer
from tests.storage_backends import Backend
from tests.test_collector_remediation import TOKEN, get, wait_ready


def test_database_url_in_the_config_selects_postgresql(
    postgres_server: PostgresServer, fresh_database: str, tmp_path: Path
) -> None:
    config_file = tmp_path / "collector.yaml"
    config_file.write_text(f"database: {fresh_database}\n")
    config = load_collector_config(config_file)
    assert config.database_url == fresh_database
    assert config.database_location == fresh_database
    with closing(open_storage(config)) as store:
        assert isinstance(store, PostgresStorage)
        store.upsert_model(ModelDeployment("m", "v1", 2))
    with PostgresStorage(fresh_database) as again:
        assert again.models() == [ModelDeployment("m", "v1", 2)]
    # a path keeps SQLite
    config_file.write_text(f"database: {tmp_path / 'state.db'}\n")
    config = load_collector_config(config_file)
    assert config.database_url is None
    store = open_storage(config)
    assert isinstance(store, SqliteStorage)
    store.close()


def password_user_url(server: PostgresServer, database: str) -> str:
    return server.url(database.rsplit("/", 1)[-1], user=PASSWORD_USER)


def test_the_password_comes_from_a_file_and_is_never_shown(
    postgres_server: PostgresServer, fresh_database: str, tmp_path: Path
) -> None:
    url = password_user_url(postgres_server, fresh_database)
    secret = tmp_path / "pg-password"
    secret.write_text(PASSWORD + "\n")
    config_file = tmp_path / "collector.yaml"
    config_file.write_text(f"database: {url}\ndatabase_password_file: {secret}\n")
    config = load_collector_config(config_file)
    assert PASSWORD not in repr(config)
    with closing(open_storage(config)) as store:
        assert store.models() == []
    secret.write_text("not the password\n")
    with pytest.raises(StorageError) as refused:
        open_storage(config)
    message = str(refused.value)
    assert "password authentication failed" in message
    assert "\n" not in message
    assert "not the password" not in message


def test_libpq_reads_pgpassword_itself(
    postgres_server: PostgresServer, fresh_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = password_user_url(postgres_server, fresh_database)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    with pytest.raises(StorageError, match="password"):
        PostgresStorage(url)
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    with PostgresStorage(url) as store:
        assert store.applied_migrations == list(range(1, LATEST_VERSION + 1))


def test_an_unreachable_server_is_one_clear_line(tmp_path: Path) -> None:
    url = f"postgresql://gpuwarden@127.0.0.1:{free_port()}/gpuwarden"
    with pytest.raises(StorageError) as caught:
        open_storage(CollectorConfig(database_url=url))
    message = str(caught.value)
    assert message.startswith(f"{url}: cannot connect to PostgreSQL: ")
    assert "refused" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("written", "problem"),
    [
        ("database: postgresql://u:hunter2@db:5432/gw\n", "a password in the URL"),
        ("database: postgresql://db/gw?password=hunter2\n", "a password in the URL"),
        ("database_url: mysql://db/gw\n", "not a postgresql:// URL"),
        ("database: /var/lib/x.db\ndatabase_password_file: {secret}\n", "only for a postgresql"),
        ("database: postgresql://db/gw\ndatabase_password_file: /nonexistent\n", "cannot read"),
    ],
)
def test_database_settings_are_checked_at_load(tmp_path: Path, written: str, problem: str) -> None:
    secret = tmp_path / "secret"
    secret.write_text("pw")
    config_file = tmp_path / "collector.yaml"
    config_file.write_text(written.format(secret=secret))
    with pytest.raises(ConfigError, match=problem) as caught:
        load_collector_config(config_file)
    assert "hunter2" not in str(caught.value)


def test_redact_url_hides_passwords() -> None:
    assert redact_url("postgresql://u:s3cret@h:5/d") == "postgresql://u:...@h:5/d"
    assert redact_url("postgresql://h/d?password=s3cret&x=1") == "postgresql://h/d?password=...&x=1"
    assert redact_url("postgresql://u@h/d") == "postgresql://u@h/d"


def test_a_dropped_connection_is_replaced_at_the_next_call(
    postgres_server: PostgresServer, fresh_database: str
) -> None:
    with PostgresStorage(fresh_database) as store:
        store.upsert_model(ModelDeployment("m", "v1", 1))
        pid = store._read("SELECT pg_backend_pid()")[0][0]
        with postgres_server.admin() as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(StorageError, match="PostgreSQL unavailable"):
            store.models()  # the call that finds the connection gone fails ...
        assert store.models() == [ModelDeployment("m", "v1", 1)]  # ... the next reconnects
        # and the same for a write: it fails whole, the next one lands
        pid = store._read("SELECT pg_backend_pid()")[0][0]
        with postgres_server.admin() as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(StorageError, match="PostgreSQL unavailable"):
            store.upsert_model(ModelDeployment("m", "v2", 1))
        assert store.upsert_model(ModelDeployment("m", "v3", 1))
        assert store.models() == [ModelDeployment("m", "v3", 1)]


def run_collector(tmp_path: Path, database: str) -> subprocess.Popen[str]:
    port = free_port()
    (tmp_path / "tokens").write_text(f"operator ops {TOKEN}\n")
    (tmp_path / "c.yaml").write_text(
        f"port: {port}\ntokens_file: {tmp_path / 'tokens'}\ndatabase: {database}\n"
    )
    return subprocess.Popen(
        [sys.executable, "-m", "gpuwarden", "collector", "--config", str(tmp_path / "c.yaml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_collector_refuses_to_start_on_an_unreachable_server(tmp_path: Path) -> None:
    url = f"postgresql://gpuwarden@127.0.0.1:{free_port()}/gpuwarden"
    with run_collector(tmp_path, url) as proc:
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1
    (line,) = [line for line in stderr.splitlines() if "cannot" in line]
    assert f"cannot open the database {url}" in line
    assert "cannot connect to PostgreSQL" in line


def test_the_collector_runs_on_postgresql(fresh_database: str, tmp_path: Path) -> None:
    """The real collector process on a PostgreSQL database: it migrates it and answers."""
    with run_collector(tmp_path, fresh_database) as proc:
        try:
            port = int((tmp_path / "c.yaml").read_text().split()[1])
            wait_ready(port, proc)
            status, body = get(f"http://127.0.0.1:{port}/v1/incidents", TOKEN)
            assert (status, json.loads(body)) == (200, {"incidents": []})
        finally:
            proc.terminate()
            proc.communicate(timeout=60)
    backend = Backend("postgresql", fresh_database)
    assert backend.query("SELECT MAX(version) FROM schema_migrations") == [(LATEST_VERSION,)]
