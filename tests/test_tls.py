"""HTTPS and mTLS between the real agent and the real collector, with a throwaway PKI.

The fixture makes a CA, a server certificate for 127.0.0.1 (IP SAN) and localhost, an agent's
client certificate, a second, unrelated CA (and a client certificate from it), and a renewed
server certificate from a new CA for the reload. Rounds are driven explicitly (``sample_once``,
``send_once``), so nothing waits on time except the collector process starting.
"""

from __future__ import annotations

import datetime as dt
import http.client
import ipaddress
import logging
import os
import signal
import ssl
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import ClientSession, web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuwarden.agent.build import AgentRuntime, build_agent
from gpuwarden.agent.config import AgentConfig, CollectorConfig, HttpConfig, SpoolConfig
from gpuwarden.agent.schema import ConfigError, convert
from gpuwarden.agent.sender import SendStatus
from gpuwarden.agent.tls import client_context
from gpuwarden.collector.cli.collector import run_collector
from gpuwarden.collector.config import TlsSettings, load_collector_config
from gpuwarden.collector.web.tls import (
    MINIMUM_VERSION,
    certificate_names,
    client_names,
    reload_certificate,
    server_context,
)
from tests.collector_server import TOKEN, CollectorThread, free_port

NODE = "node-tls"
NODE_DNS = "node-tls.cluster.example"


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


class Authority:
    """A throwaway CA that issues leaf certificates (EC P-256, valid from an hour ago)."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        public = self._key.public_key()
        self._cert = (
            self._builder(self._name, public)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.ca_file = folder / f"{name.replace(' ', '-')}.pem"
        self.ca_file.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def _builder(
        self, subject: x509.Name, public: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        now = dt.datetime.now(dt.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        )

    def issue(
        self, stem: str, common_name: str, *, dns: Sequence[str] = (), ips: Sequence[str] = ()
    ) -> Pair:
        """A server (``ips`` given) or client certificate, written as ``<stem>.pem/.key``."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        usage = ExtendedKeyUsageOID.SERVER_AUTH if ips else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            self._builder(subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = Pair(self.folder / f"{stem}.pem", self.folder / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return pair


@dataclass(frozen=True)
class Pki:
    ca: Authority
    server: Pair
    client: Pair
    other_ca: Authority  # unrelated to everything the collector trusts
    other_client: Pair  # a client certificate from the unrelated CA
    new_ca: Authority
    renewed_server: Pair  # from new_ca, for the reload


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    server = {"dns": ["localhost"], "ips": ["127.0.0.1"]}
    ca, other, new = (Authority(folder, n) for n in ("Fleet CA", "Unrelated CA", "New CA"))
    return Pki(
        ca=ca,
        server=ca.issue("server", "gpuwarden-collector", **server),
        client=ca.issue("client", NODE, dns=[NODE_DNS]),
        other_ca=other,
        other_client=other.issue("other-client", NODE, dns=[NODE_DNS]),
        new_ca=new,
        renewed_server=new.issue("renewed", "gpuwarden-collector", **server),
    )


def tls(pki: Pki, *, mtls: bool = False, required: bool = False) -> TlsSettings:
    return TlsSettings(
        cert_file=pki.server.cert,
        key_file=pki.server.key,
        client_ca_file=pki.ca.ca_file if mtls else None,
        require_client_cert=required,
    )


@pytest.fixture
def https_collector(pki: Pki) -> Iterator[CollectorThread]:
    with CollectorThread(ssl_context=server_context(tls(pki))) as collector:
        yield collector


@pytest.fixture
def mtls_collector(pki: Pki) -> Iterator[CollectorThread]:
    context = server_context(tls(pki, mtls=True, required=True))
    with CollectorThread(ssl_context=context) as collector:
        yield collector


def make_agent(
    spool: Path, endpoint: str, *, ca: Path | None, client: Pair | None = None
) -> AgentRuntime:
    config = AgentConfig(
        node_name=NODE,
        source="simulated",
        collector=CollectorConfig(
            endpoint=endpoint,
            token=TOKEN,
            timeout_seconds=5,
            ca_file=ca,
            cert_file=client.cert if client else None,
            key_file=client.key if client else None,
        ),
        spool=SpoolConfig(directory=spool, fsync=False),
        http=HttpConfig(enabled=False),
    )
    return build_agent(config, with_host=False)


def push_one_round(runtime: AgentRuntime) -> SendStatus:
    """Sample once (the round lands in the spool), then try to send it once."""
    runtime.agent.sample_once()
    assert runtime.agent.sender is not None
    return runtime.agent.sender.send_once().status


def spooled(runtime: AgentRuntime) -> int:
    assert runtime.agent.spool is not None
    return len(runtime.agent.spool)


REFUSED = {SendStatus.RETRY, SendStatus.UNAUTHORIZED}
TLS_LINES = ("TLS handshake failed", "closed a new TLS connection without answering")


def tls_refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if any(t in r.getMessage() for t in TLS_LINES)]


def test_agent_delivers_over_https(tmp_path, pki, https_collector):
    runtime = make_agent(tmp_path / "spool", https_collector.endpoint, ca=pki.ca.ca_file)
    try:
        assert https_collector.endpoint.startswith("https://127.0.0.1:")
        assert push_one_round(runtime) is SendStatus.SENT
        assert spooled(runtime) == 0
    finally:
        runtime.agent.shutdown(flush_timeout_seconds=5)
    assert https_collector.log.hosts() == {NODE}
    assert "hw.gpu.utilization" in https_collector.log.metric_names()


def test_agent_with_a_wrong_ca_is_refused_keeps_its_batch_and_delivers_it_later(
    tmp_path, pki, https_collector, caplog
):
    wrong = make_agent(tmp_path / "spool", https_collector.endpoint, ca=pki.other_ca.ca_file)
    try:
        with caplog.at_level(logging.ERROR, logger="gpuwarden.agent.sender"):
            assert push_one_round(wrong) is SendStatus.UNAUTHORIZED
            assert push_one_round(wrong) is SendStatus.UNAUTHORIZED
        assert spooled(wrong) == 2
    finally:
        assert not wrong.agent.shutdown(flush_timeout_seconds=0)  # kept for the next start
    assert https_collector.log.hosts() == set()
    (line,) = tls_refusals(caplog)  # one line for the streak, no traceback
    assert line.exc_info is None
    assert "certificate verify failed: unable to get local issuer certificate" in line.getMessage()
    assert "1 record(s) kept in the spool" in line.getMessage()  # logged at the first
    # the same spool, the right CA: both rounds arrive, in order, nothing lost
    right = make_agent(tmp_path / "spool", https_collector.endpoint, ca=pki.ca.ca_file)
    try:
        assert spooled(right) == 2
        assert right.agent.sender is not None
        assert right.agent.sender.flush(timeout_seconds=10)
    finally:
        right.agent.shutdown(flush_timeout_seconds=5)
    (series,) = https_collector.log.series("gpuwarden.agent.samples", NODE).values()
    assert [value for _, value in series] == [1.0, 2.0]


def test_agent_without_a_ca_file_uses_the_system_store_and_refuses_a_private_ca(
    tmp_path, https_collector, caplog
):
    runtime = make_agent(tmp_path / "spool", https_collector.endpoint, ca=None)
    try:
        with caplog.at_level(logging.ERROR, logger="gpuwarden.agent.sender"):
            assert push_one_round(runtime) is SendStatus.UNAUTHORIZED
        assert spooled(runtime) == 1
    finally:
        runtime.agent.shutdown(flush_timeout_seconds=0)
    assert https_collector.log.hosts() == set()
    assert len(tls_refusals(caplog)) == 1


@pytest.mark.parametrize(
    ("client", "delivered"), [("none", False), ("unrelated CA", False), ("right", True)]
)
def test_mtls_refuses_agents_without_a_trusted_client_certificate(
    tmp_path, pki, mtls_collector, caplog, client, delivered
):
    pair = {"none": None, "unrelated CA": pki.other_client, "right": pki.client}[client]
    runtime = make_agent(
        tmp_path / "spool", mtls_collector.endpoint, ca=pki.ca.ca_file, client=pair
    )
    try:
        with caplog.at_level(logging.ERROR, logger="gpuwarden.agent.sender"):
            status = push_one_round(runtime)
        # refused: RETRY when the collector closes without its alert (asyncio under TLS 1.3
        # does), UNAUTHORIZED when the alert arrives; the round stays spooled either way
        assert status in ({SendStatus.SENT} if delivered else REFUSED)
        assert spooled(runtime) == (0 if delivered else 1)
    finally:
        runtime.agent.shutdown(flush_timeout_seconds=0)
    assert mtls_collector.log.hosts() == ({NODE} if delivered else set())
    refusals = tls_refusals(caplog)
    assert len(refusals) == (0 if delivered else 1)
    for line in refusals:
        assert "collector.cert_file/key_file" in line.getMessage()  # names the fix
        assert line.exc_info is None


async def names_handler(request: web.Request) -> web.Response:
    return web.json_response(list(client_names(request)))


@pytest.mark.parametrize("with_cert", [True, False])
async def test_client_names_are_the_verified_certificates_cn_and_dns_sans(
    aiohttp_server, pki, with_cert
):
    app = web.Application()
    app.router.add_get("/names", names_handler)
    server = await aiohttp_server(app, ssl=server_context(tls(pki, mtls=True)))  # optional mTLS
    context = ssl.create_default_context(cafile=str(pki.ca.ca_file))
    if with_cert:
        context.load_cert_chain(str(pki.client.cert), str(pki.client.key))
    async with (
        ClientSession() as session,
        session.get(server.make_url("/names"), ssl=context) as response,
    ):
        assert response.status == 200
        names = await response.json()
    assert names == ([NODE, NODE_DNS] if with_cert else [])


async def test_client_names_over_plain_http_are_empty(aiohttp_client):
    app = web.Application()
    app.router.add_get("/names", names_handler)
    client = await aiohttp_client(app)
    response = await client.get("/names")
    assert await response.json() == []


def handshake(port: int, ca: Path) -> str:
    """Connect trusting only ``ca``; return the server certificate's issuer CN."""
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=context)
    try:
        conn.connect()
        assert isinstance(conn.sock, ssl.SSLSocket)
        cert = conn.sock.getpeercert()
        assert cert is not None
        (issuer,) = certificate_names({"subject": cert["issuer"]})  # the issuer's CN
        return issuer
    finally:
        conn.close()


def test_reload_swaps_the_certificate_in_the_same_context_and_keeps_it_on_bad_files(
    tmp_path, pki, caplog
):
    live = tmp_path / "live"
    live.mkdir()
    settings = TlsSettings(cert_file=live / "cert.pem", key_file=live / "key.pem")
    settings.cert_file.write_bytes(pki.server.cert.read_bytes())  # type: ignore[union-attr]
    settings.key_file.write_bytes(pki.server.key.read_bytes())  # type: ignore[union-attr]
    context = server_context(settings)
    assert context.minimum_version is MINIMUM_VERSION
    with CollectorThread(ssl_context=context) as collector:
        assert handshake(collector.port, pki.ca.ca_file) == "Fleet CA"
        # renewed files: new connections get the new certificate
        settings.cert_file.write_bytes(pki.renewed_server.cert.read_bytes())  # type: ignore[union-attr]
        settings.key_file.write_bytes(pki.renewed_server.key.read_bytes())  # type: ignore[union-attr]
        assert reload_certificate(context, settings)
        assert handshake(collector.port, pki.new_ca.ca_file) == "New CA"
        with pytest.raises(ssl.SSLCertVerificationError):
            handshake(collector.port, pki.ca.ca_file)
        # a key that does not match: the previous certificate stays, one line says why
        settings.key_file.write_bytes(pki.client.key.read_bytes())  # type: ignore[union-attr]
        with caplog.at_level(logging.ERROR, logger="gpuwarden.collector.web.tls"):
            assert not reload_certificate(context, settings)
        (line,) = caplog.records
        assert "not reloaded, still serving the previous one" in line.getMessage()
        assert str(settings.key_file) in line.getMessage()
        assert handshake(collector.port, pki.new_ca.ca_file) == "New CA"


WATCHDOG_SECONDS = 180.0


class CollectorProcess:
    """``gpuwarden collector`` with ``tls`` as a real process (SIGHUP needs its main thread)."""

    def __init__(self, tmp: Path, pki: Pki) -> None:
        self.port = free_port()
        self.cert, self.key = tmp / "cert.pem", tmp / "key.pem"
        self.cert.write_bytes(pki.server.cert.read_bytes())
        self.key.write_bytes(pki.server.key.read_bytes())
        (tmp / "tokens").write_text(f"agent agents {TOKEN} nodes=*\n")
        self.config = tmp / "collector.yaml"
        self.config.write_text(
            f"port: {self.port}\ntokens_file: {tmp / 'tokens'}\n"
            f"database: {tmp / 'collector.db'}\n"
            f"tls: {{cert_file: {self.cert}, key_file: {self.key}}}\n"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwarden", "collector", "--config", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        # a watchdog, not a deadline under test: a hung collector ends the reads below
        self._watchdog = threading.Timer(WATCHDOG_SECONDS, self.proc.kill)
        self._watchdog.start()

    def wait_for_line(self, text: str) -> str:
        """Read the collector's log until a line containing ``text`` (or its exit)."""
        assert self.proc.stderr is not None
        seen = []
        for line in self.proc.stderr:
            seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"collector exited before logging {text!r}: {''.join(seen)[-2000:]}")

    def stop(self) -> None:
        self._watchdog.cancel()
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def test_sighup_reloads_the_served_certificate(tmp_path, pki):
    collector = CollectorProcess(tmp_path, pki)
    try:
        collector.wait_for_line(f"Running on https://127.0.0.1:{collector.port}")
        assert handshake(collector.port, pki.ca.ca_file) == "Fleet CA"
        collector.cert.write_bytes(pki.renewed_server.cert.read_bytes())
        collector.key.write_bytes(pki.renewed_server.key.read_bytes())
        os.kill(collector.proc.pid, signal.SIGHUP)
        collector.wait_for_line("TLS certificate reloaded")
        assert handshake(collector.port, pki.new_ca.ca_file) == "New CA"
        collector.key.write_text("not a key\n")
        os.kill(collector.proc.pid, signal.SIGHUP)
        collector.wait_for_line("TLS certificate not reloaded")
        assert handshake(collector.port, pki.new_ca.ca_file) == "New CA"
        assert collector.proc.poll() is None
    finally:
        collector.stop()


def test_a_certificate_and_key_that_do_not_match_stop_the_start(tmp_path, pki, capsys):
    config = tmp_path / "collector.yaml"
    config.write_text(
        "allow_unauthenticated: true\n"
        f"database: {tmp_path / 'c.db'}\n"
        f"tls: {{cert_file: {pki.server.cert}, key_file: {pki.client.key}}}\n"
    )
    assert run_collector(config, host=None, port=free_port(), environ={}) == 2
    message = capsys.readouterr().err
    assert message.startswith("gpuwarden collector: configuration error: tls.cert_file ")
    assert str(pki.client.key) in message
    assert not (tmp_path / "c.db").exists()  # refused before anything opened


COLLECTOR_TLS_ERRORS = [
    ("tls: {cert_file: CERT}\n", "tls.key_file: required with cert_file"),
    ("tls: {key_file: KEY}\n", "tls.cert_file: required with key_file"),
    (
        "tls: {cert_file: CERT, key_file: KEY, require_client_cert: true}\n",
        "tls.client_ca_file: required with require_client_cert: true",
    ),
    ("tls: {client_ca_file: CA}\n", "tls.cert_file: required with client_ca_file"),
    (
        "tls: {cert_file: CERT, key_file: /nonexistent/key.pem}\n",
        "tls.key_file: cannot read /nonexistent/key.pem: No such file or directory",
    ),
    ("tls: {cert_file: CERT, key_file: KEY, ca_file: CA}\n", "tls: unknown key 'ca_file'"),
]


@pytest.mark.parametrize(("text", "message"), COLLECTOR_TLS_ERRORS)
def test_collector_tls_config_errors_name_the_key(tmp_path, pki, text, message):
    path = tmp_path / "collector.yaml"
    files = {"CERT": pki.server.cert, "KEY": pki.server.key, "CA": pki.ca.ca_file}
    for word, file in files.items():
        text = text.replace(word, str(file))
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_collector_config(path)
    assert str(info.value).startswith(f"{path}: {message}")


def test_collector_tls_config_loads(tmp_path, pki):
    path = tmp_path / "collector.yaml"
    path.write_text(
        f"tls: {{cert_file: {pki.server.cert}, key_file: {pki.server.key}, "
        f"client_ca_file: {pki.ca.ca_file}, require_client_cert: true}}\n"
    )
    assert load_collector_config(path).tls == tls(pki, mtls=True, required=True)
    assert not load_collector_config(None).tls.enabled


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"endpoint": "http://c:4318/v1/metrics", "ca_file": "CA"}, "ca_file: set, but the"),
        ({"cert_file": "CERT"}, "key_file: required with cert_file"),
    ],
)
def test_agent_tls_config_errors_name_the_key(pki, fields, message):
    files = {"CA": pki.ca.ca_file, "CERT": pki.client.cert}
    written = {k: str(files.get(v, v)) for k, v in fields.items()}
    written.setdefault("endpoint", "https://c:4318/v1/metrics")
    with pytest.raises(ConfigError, match=f"collector.{message}"):
        convert({"collector": written}, AgentConfig, "agent.yaml")


def test_agent_tls_files_that_do_not_load_are_config_errors(tmp_path, pki):
    endpoint = "https://127.0.0.1:1/v1/metrics"
    missing = CollectorConfig(endpoint=endpoint, ca_file=tmp_path / "none.pem")
    with pytest.raises(ConfigError, match=r"^collector.ca_file: .*none.pem: not a readable"):
        client_context(missing)
    mismatched = CollectorConfig(
        endpoint=endpoint,
        ca_file=pki.ca.ca_file,
        cert_file=pki.client.cert,
        key_file=pki.server.key,
    )
    with pytest.raises(ConfigError, match=r"^collector.cert_file .* not a matching"):
        client_context(mismatched)
    context = client_context(CollectorConfig(endpoint=endpoint, ca_file=pki.ca.ca_file))
    assert context is not None
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2
    assert client_context(CollectorConfig(endpoint="http://127.0.0.1:1/v1/metrics")) is None


@pytest.mark.parametrize("highest", [ssl.TLSVersion.TLSv1_1, ssl.TLSVersion.TLSv1_2], ids=str)
def test_the_collector_refuses_a_handshake_below_tls_1_2(pki, https_collector, highest):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(pki.ca.ca_file))
    with warnings.catch_warnings():  # a client that offers TLS 1.0 and 1.1 on purpose
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = highest
    context.set_ciphers("ALL:@SECLEVEL=0")
    conn = http.client.HTTPSConnection(
        "127.0.0.1", https_collector.port, timeout=5, context=context
    )
    try:
        if highest is ssl.TLSVersion.TLSv1_2:
            conn.connect()
            assert isinstance(conn.sock, ssl.SSLSocket)
            assert conn.sock.version() == "TLSv1.2"
        else:  # the client hello went out (no local error); the collector hung up on it
            with pytest.raises(ssl.SSLEOFError):
                conn.connect()
    finally:
        conn.close()
