"""The collector's pooled HTTP client against real local servers: one connection reused, no
retries, no redirects, and network failures as status 0."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from aiohttp import web

from gpuwarden.collector.clients.http import HttpClient, HttpTimeout
from tests.capture_servers import ServedApp


class Peers:
    """The client ports (one per TCP connection) and paths a server saw."""

    def __init__(self) -> None:
        self.ports: list[int] = []
        self.paths: list[str] = []


@pytest.fixture
def server() -> Iterator[tuple[Peers, ServedApp]]:
    peers = Peers()

    async def handle(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        peers.ports.append(peer[1] if peer else -1)
        peers.paths.append(request.path)
        if request.path == "/moved":
            raise web.HTTPFound("/elsewhere")
        if request.path == "/busy":
            return web.Response(status=503, text="busy", headers={"Retry-After": "7"})
        if request.path == "/big":
            return web.Response(body=b"x" * 1000)
        return web.Response(text=f"hello {request.method}")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    served = ServedApp(app)
    yield peers, served
    served.stop()


def test_two_requests_share_one_tcp_connection(server):
    peers, served = server
    client = HttpClient()
    first = client.request("GET", served.url + "/a")
    second = client.request("POST", served.url + "/b", body=b"{}")
    assert (first.status, first.body, second.body) == (200, b"hello GET", b"hello POST")
    assert len(peers.ports) == 2
    assert len(set(peers.ports)) == 1  # the second request reused the first one's connection
    client.close()


def test_an_error_answer_is_returned_once_with_its_headers(server):
    peers, served = server
    answer = HttpClient().request("GET", served.url + "/busy")
    assert (answer.status, answer.body, answer.ok) == (503, b"busy", False)
    assert answer.header("retry-after") == "7"
    assert answer.detail == "Service Unavailable"
    assert peers.paths == ["/busy"]  # no retry


def test_a_redirect_is_not_followed(server):
    peers, served = server
    answer = HttpClient().request("GET", served.url + "/moved")
    assert answer.status == 302
    assert answer.header("Location") == "/elsewhere"
    assert peers.paths == ["/moved"]


def test_a_body_over_the_limit_is_cut_and_marked(server):
    _, served = server
    client = HttpClient()
    answer = client.request("GET", served.url + "/big", max_body_bytes=100)
    assert (answer.status, len(answer.body), answer.truncated) == (200, 100, True)
    whole = client.request("GET", served.url + "/big", max_body_bytes=1000)
    assert (len(whole.body), whole.truncated) == (1000, False)


def test_a_server_that_never_answers_is_a_timeout_as_status_0():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # accepts the connection (backlog), never answers
        port = listener.getsockname()[1]
        client = HttpClient(timeout=HttpTimeout(connect_seconds=1.0, read_seconds=0.2))
        answer = client.request("GET", f"http://127.0.0.1:{port}/metrics")
    assert answer.status == 0
    assert answer.detail == "unreachable: ReadTimeoutError"


def test_refused_connections_and_other_schemes_are_status_0_never_raised():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, not listening: refused
        answer = HttpClient().request("GET", f"http://127.0.0.1:{port}/", timeout_seconds=1.0)
    assert answer.status == 0
    assert answer.detail == "unreachable: ConnectionRefusedError"
    assert HttpClient().request("GET", "file:///etc/passwd").status == 0


def test_timeouts_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        HttpTimeout(connect_seconds=0)


def test_requests_go_through_the_proxy_the_environment_names(server):
    """A site behind a proxy keeps reaching PagerDuty and Slack: the client sends plain-HTTP
    requests to the proxy in absolute form (the proxy here is the local server; the target
    host is never resolved), and NO_PROXY hosts go direct."""
    from gpuwarden.collector.clients.http import Proxies

    peers, served = server
    proxies = Proxies.from_environment({"HTTP_PROXY": served.url, "no_proxy": "localhost"})
    client = HttpClient(proxies=proxies)
    via = client.request("POST", "http://alerts.example.invalid/v2/enqueue", body=b"{}")
    assert via.status == 200
    assert peers.paths == ["/v2/enqueue"]  # reached the proxy, for the far host's path
    direct = Proxies.from_environment({"HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": "127.0.0.1"})
    assert HttpClient(proxies=direct).request("GET", served.url + "/d").status == 200
    assert proxies.for_url("http://localhost:1/x") is None
    assert proxies.for_url("https://events.pagerduty.com/v2/enqueue") is None  # no HTTPS_PROXY
    both = Proxies.from_environment({"HTTPS_PROXY": "http://p:3128", "NO_PROXY": ".corp, db:5432"})
    assert both.for_url("https://events.pagerduty.com/x") == "http://p:3128"
    assert both.for_url("https://api.corp/x") is None
    assert both.for_url("https://db:5432/x") is None
    assert both.for_url("https://db:443/x") == "http://p:3128"
    client.close()
