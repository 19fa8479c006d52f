"""A real PostgreSQL (Debian ``postgresql``) on loopback for the storage tests.

``PostgresServer`` runs ``initdb`` into a temporary directory and ``pg_ctl start`` on a free
loopback port with its unix socket in that directory. PostgreSQL refuses to run as root (CI runs
as root), so there it runs as the ``postgres`` user the Debian package creates, in a directory
that user owns. One server per test session (the ``postgres_server`` fixture); each test gets
its own empty database (``fresh_database``), created from ``template0`` and dropped after.

Tests that need it skip, naming what to install, only when the PostgreSQL programs are absent;
any other failure to start is an error, never a silent skip.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import psycopg
import pytest

from tests.collector_server import free_port

SUPERUSER = "gpuwarden"
#: a role that must log in with a password (scram-sha-256), for the password tests
PASSWORD_USER = "gpuwarden_pw"
PASSWORD = "correct horse battery staple"


def postgres_bindir() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl`` (newest Debian version), if installed."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    return Path(versions[-1]).parent if versions else None


def _version(path: str) -> float:
    try:
        return float(Path(path).parent.parent.name)
    except ValueError:
        return 0.0


class PostgresServer:
    """A private PostgreSQL cluster; :meth:`start`, :meth:`url`, :meth:`create_database`."""

    def __init__(self, bindir: Path) -> None:
        self._bin = bindir
        self._dir = Path(tempfile.mkdtemp(prefix="gpuwarden-pg-"))
        self.port = free_port()
        self._as: Sequence[str] = ()
        self._count = 0
        self._count_lock = threading.Lock()
        if os.geteuid() == 0:  # PostgreSQL refuses root: run it as the package's user
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError(
                    "running as root and there is no 'postgres' user to run PostgreSQL as "
                    "(the Debian postgresql package creates it)"
                ) from None
            os.chown(self._dir, user.pw_uid, user.pw_gid)
            self._as = ("runuser", "-u", "postgres", "--")
        self.data = self._dir / "data"
        self.log = self._dir / "postgres.log"

    def _run(self, *argv: str) -> None:
        done = subprocess.run(
            [*self._as, *argv], capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{argv[0]} failed: {done.stdout}{done.stderr}{tail}")

    def start(self) -> None:
        self._run(
            str(self._bin / "initdb"),
            *("-D", str(self.data), "-U", SUPERUSER, "--auth=trust"),
            *("-E", "UTF8", "--locale=C.UTF-8", "--no-sync"),
        )
        # The password role must authenticate; everyone else is trusted on loopback.
        hba = self.data / "pg_hba.conf"
        rules = hba.read_text()
        first = f"host all {PASSWORD_USER} 127.0.0.1/32 scram-sha-256\n"
        self._write_as_owner(hba, first + rules)
        options = (
            f"-p {self.port} -k {self._dir} -c listen_addresses=127.0.0.1"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            " -c max_connections=200"
        )
        self._run(
            str(self._bin / "pg_ctl"),
            *("-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60"),
            "start",
        )
        with self.admin() as conn:
            conn.execute(f"CREATE ROLE {PASSWORD_USER} LOGIN PASSWORD '{PASSWORD}'")

    def _write_as_owner(self, path: Path, text: str) -> None:
        stat = path.stat()
        path.write_text(text)
        os.chown(path, stat.st_uid, stat.st_gid)

    def stop(self) -> None:
        if self.data.exists():
            # RuntimeError: not running (start failed), nothing to stop
            with contextlib.suppress(RuntimeError):
                self._run(
                    str(self._bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"
                )
        shutil.rmtree(self._dir, ignore_errors=True)

    def url(self, database: str = "postgres", user: str = SUPERUSER) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def admin(self, database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.url(database), autocommit=True)

    def create_database(self) -> str:
        """A new empty database; its name."""
        with self._count_lock:
            self._count += 1
            name = f"test_{self._count}"
        with self.admin() as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE template0")
            conn.execute(f"GRANT ALL ON DATABASE {name} TO {PASSWORD_USER}")
        with self.admin(name) as conn:
            conn.execute(f"GRANT ALL ON SCHEMA public TO {PASSWORD_USER}")
        return name

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One private PostgreSQL for the session (skipped only when it is not installed)."""
    bindir = postgres_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    server = PostgresServer(bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def fresh_database(postgres_server: PostgresServer) -> Iterator[str]:
    """The URL of a new, empty database on the session's server, dropped after the test."""
    name = postgres_server.create_database()
    try:
        yield postgres_server.url(name)
    finally:
        postgres_server.drop_database(name)
