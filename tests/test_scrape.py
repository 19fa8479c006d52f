"""Scraping vLLM and Triton /metrics pages over real loopback HTTP into gpuwarden.model.*."""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gpuwarden.collector.build import build_service
from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.ingest.otlp import HistogramPoint, NumberPoint
from gpuwarden.collector.ingest.scrape import (
    MODEL_METRICS,
    ModelServerScraper,
    ScrapeTarget,
    convert,
)
from gpuwarden.collector.store.types import AttrValue, series_key

DATA = Path(__file__).parent / "data" / "scrape"
DOC = Path(__file__).parent.parent / "docs" / "model-metrics.md"
NOW = 1_700_000_000.0
NOW_NS = 1_700_000_000 * 10**9
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
# vLLM's bucket lists (vllm/v1/metrics/loggers.py)
LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
       20.0, 40.0, 80.0)  # fmt: skip

Route = Callable[[], tuple[int, bytes, bool]]  # status, body, send Content-Length


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.routes: dict[str, Route] = {}
        self.redirects: dict[str, str] = {}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        location = self.server.redirects.get(self.path)
        if location is not None:
            self.send_response(307)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        route = self.server.routes.get(self.path)
        if route is None:
            self.send_error(404)
            return
        status, body, sized = route()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        if sized:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()  # HTTP/1.0: without Content-Length the body ends when we close
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class MetricsServer:
    """A model server stand-in on 127.0.0.1 that answers each path as told."""

    def __init__(self, httpd: _Server) -> None:
        self.httpd = httpd
        self.port = httpd.server_address[1]
        self.instance = f"127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def serve(self, path: str, body: bytes, status: int = 200, *, sized: bool = True) -> str:
        self.httpd.routes[path] = lambda: (status, body, sized)
        return self.url(path)


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    httpd = _Server()
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield MetricsServer(httpd)
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


@pytest.fixture
def dead_url() -> str:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens on it
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/metrics"


def page(name: str) -> bytes:
    return (DATA / f"{name}.txt").read_bytes()


def buckets(n_bounds: int, filled: dict[int, int]) -> tuple[int, ...]:
    """Per-bucket counts: ``n_bounds + 1`` buckets, zero but for ``filled``."""
    return tuple(filled.get(i, 0) for i in range(n_bounds + 1))


Labels = frozenset[tuple[str, AttrValue]]
Row = tuple[str, str, bool, str, Labels, float]


def numbers_without(points: Sequence[NumberPoint], common: dict[str, AttrValue]) -> set[Row]:
    """(metric, kind, monotonic, unit, the attributes beyond ``common``, value) of each point."""
    out: set[Row] = set()
    for p in points:
        assert {k: p.attributes[k] for k in common} == common, p
        rest = frozenset((k, v) for k, v in p.attributes.items() if k not in common)
        out.add((p.metric, p.kind, p.monotonic, p.unit, rest, p.value))
    assert len(out) == len(points)
    return out


# --- mapping ---------------------------------------------------------------------------------


def test_a_vllm_page_becomes_model_metrics(server):
    url = server.serve("/metrics", page("vllm"))
    target = ScrapeTarget(url, server="vllm", node="gpu-node-1", labels={"team": "serving"})
    result = ModelServerScraper([target], clock=lambda: NOW).scrape_once()

    (outcome,) = result.targets
    assert (outcome.ok, outcome.error, outcome.points) == (True, None, 13)
    # 13 table rows match, two of them superseded by their newer names on the same page
    assert (outcome.mapped_families, outcome.unmapped_families) == (11, 21)
    assert result.failed == ()
    common: dict[str, AttrValue] = {
        "model": LLAMA,
        "engine": "0",
        "team": "serving",
        "service.instance.id": server.instance,
        "host.name": "gpu-node-1",
    }
    assert numbers_without(result.points, common) == {
        ("gpuwarden.model.queue.size", "gauge", False, "{request}", frozenset({("state", "running")}), 3.0),  # noqa: E501
        ("gpuwarden.model.queue.size", "gauge", False, "{request}", frozenset({("state", "waiting")}), 2.0),  # noqa: E501
        ("gpuwarden.model.kv_cache.utilization", "gauge", False, "1", frozenset(), 0.42),
        ("gpuwarden.model.preemptions", "sum", True, "{preemption}", frozenset(), 1.0),
        ("gpuwarden.model.tokens", "sum", True, "{token}", frozenset({("direction", "prompt")}), 1234.0),  # noqa: E501
        ("gpuwarden.model.tokens", "sum", True, "{token}", frozenset({("direction", "generation")}), 5678.0),  # noqa: E501
        ("gpuwarden.model.requests", "sum", True, "{request}", frozenset({("reason", "stop"), ("outcome", "success")}), 5.0),  # noqa: E501
        ("gpuwarden.model.requests", "sum", True, "{request}", frozenset({("reason", "length"), ("outcome", "success")}), 1.0),  # noqa: E501
        ("gpuwarden.model.requests", "sum", True, "{request}", frozenset({("reason", "abort"), ("outcome", "cancelled")}), 0.0),  # noqa: E501
    }  # fmt: skip
    stamped: list[NumberPoint | HistogramPoint] = [*result.points, *result.histograms]
    for p in stamped:
        assert p.time_unix_nano == NOW_NS
        # host.name on the point only: the resource must not stand for the node (node facts)
        assert p.resource == {"service.instance.id": server.instance}

    hists = {h.metric: h for h in result.histograms}
    assert len(hists) == len(result.histograms) == 4
    for h in hists.values():
        assert h.attributes == common
        assert h.unit == "s"
    latency = hists["gpuwarden.model.request.latency"]
    # observed 0.4, 0.4, 0.9, 1.2, 3.0, 12.0: cumulative le counts 0,2,2,3,4,4,4,5,5,6,...,6
    assert latency.bounds == LATENCY
    assert latency.bucket_counts == buckets(21, {1: 2, 3: 1, 4: 1, 7: 1, 9: 1})
    assert latency.sum_value == pytest.approx(17.9)
    ttft = hists["gpuwarden.model.time_to_first_token"]  # 0.03, 0.05, 0.09, 0.3, 0.3, 1.7
    assert (ttft.bounds, ttft.bucket_counts) == (TTFT, buckets(22, {4: 1, 5: 1, 7: 1, 9: 2, 12: 1}))
    tpot = hists["gpuwarden.model.time_per_output_token"]  # 0.02, 0.02, 0.03, 0.06, 0.12
    assert (tpot.bounds, tpot.bucket_counts) == (ITL, buckets(19, {1: 2, 2: 1, 3: 1, 5: 1}))
    queue = hists["gpuwarden.model.queue.duration"]  # 0.1, 0.1, 0.2, 0.2, 0.6, 2.0
    assert (queue.bounds, queue.bucket_counts) == (LATENCY, buckets(21, {0: 4, 2: 1, 5: 1}))
    assert queue.sum_value == pytest.approx(3.2)


def test_a_triton_page_becomes_model_metrics(server):
    url = server.serve("/metrics", page("triton"))
    target = ScrapeTarget(url, model="fallback", server="triton", node="gpu-node-2")
    result = ModelServerScraper([target], clock=lambda: NOW).scrape_once()

    (outcome,) = result.targets
    assert (outcome.ok, outcome.points, outcome.mapped_families) == (True, 23, 9)
    assert outcome.unmapped_families == 13  # compute input/output, pinned memory, GPU, CPU
    common: dict[str, AttrValue] = {
        "service.instance.id": server.instance,
        "host.name": "gpu-node-2",
    }
    llm = frozenset({("model", "tensorrt_llm"), ("model.version", "1")})
    resnet = frozenset({("model", "resnet50"), ("model.version", "2")})

    def req(model: Labels, value: float, outcome: str, reason: str | None = None) -> Row:
        extra = {("outcome", outcome)} | ({("reason", reason)} if reason else set())
        return ("gpuwarden.model.requests", "sum", True, "{request}", model | extra, value)

    def sums(name: str, unit: str, llm_value: float, resnet_value: float) -> set[Row]:
        return {
            (name, "sum", True, unit, llm, llm_value),
            (name, "sum", True, unit, resnet, resnet_value),
        }

    assert numbers_without(result.points, common) == {
        req(llm, 120.0, "success"),
        req(resnet, 8192.0, "success"),
        req(llm, 2.0, "failure", "REJECTED"),
        req(llm, 1.0, "cancelled", "CANCELED"),
        req(llm, 0.0, "failure", "BACKEND"),
        req(llm, 0.0, "failure", "OTHER"),
        req(resnet, 0.0, "failure", "REJECTED"),
        req(resnet, 0.0, "cancelled", "CANCELED"),
        req(resnet, 12.0, "failure", "BACKEND"),
        req(resnet, 0.0, "failure", "OTHER"),
        *sums("gpuwarden.model.inferences", "{inference}", 120.0, 65536.0),
        *sums("gpuwarden.model.executions", "{execution}", 118.0, 2048.0),
        # cumulative microseconds become cumulative seconds
        *sums("gpuwarden.model.request.time", "s", 93.5, 40.96),
        *sums("gpuwarden.model.queue.time", "s", 1.25, 0.8192),
        *sums("gpuwarden.model.compute.time", "s", 91.0, 36.864),
        ("gpuwarden.model.queue.size", "gauge", False, "{request}", llm | {("state", "waiting")}, 4.0),  # noqa: E501
        ("gpuwarden.model.queue.size", "gauge", False, "{request}", resnet | {("state", "waiting")}, 0.0),  # noqa: E501
    }  # fmt: skip
    (first,) = result.histograms
    assert first.metric == "gpuwarden.model.time_to_first_token"
    assert first.attributes == {**common, "model": "tensorrt_llm", "model.version": "1"}
    # le 100, 500, 2000, 5000 ms -> s; cumulative 8, 30, 36, 37, +Inf 37
    assert (first.bounds, first.bucket_counts) == ((0.1, 0.5, 2.0, 5.0), (8, 22, 6, 1, 0))
    assert first.sum_value == pytest.approx(10.771)
    assert first.time_unix_nano == NOW_NS


def test_older_vllm_names_are_used_when_the_new_ones_are_absent():
    # a vLLM 0.8-0.10 page: no inter_token_latency_seconds and no kv_cache_usage_perc yet
    text = page("vllm").decode()
    older = "\n".join(
        line
        for line in text.splitlines()
        if "vllm:inter_token_latency_seconds" not in line and "vllm:kv_cache_usage_perc" not in line
    )
    target = ScrapeTarget("http://vllm-0:8000/metrics", server="vllm")
    numbers, hists, result = convert(target, older, NOW_NS)
    assert (result.mapped_families, result.points) == (11, 13)  # same points, older names
    (kv,) = [p for p in numbers if p.metric == "gpuwarden.model.kv_cache.utilization"]
    assert kv.value == 0.42
    (tpot,) = [h for h in hists if h.metric == "gpuwarden.model.time_per_output_token"]
    assert tpot.bucket_counts == buckets(19, {1: 2, 2: 1, 3: 1, 5: 1})
    assert kv.attributes["service.instance.id"] == "vllm-0:8000"
    assert "host.name" not in kv.attributes  # no node given


def test_the_targets_model_stands_in_when_the_server_names_none():
    text = (
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        "vllm:num_requests_waiting 7.0\n"
        "# TYPE vllm:num_requests_running untyped\n"
        "vllm:num_requests_running 1.0\n"
    )
    target = ScrapeTarget("https://llm.internal/metrics", model="llama-70b", server="prometheus")
    numbers, _, result = convert(target, text, NOW_NS)
    (waiting,) = numbers
    assert waiting.attributes == {
        "model": "llama-70b",
        "state": "waiting",
        "service.instance.id": "llm.internal:443",
    }
    assert (result.mapped_families, result.unmapped_families) == (1, 1)  # untyped: not mapped


def test_histograms_without_inf_use_count_and_malformed_ones_are_skipped():
    text = "\n".join(
        [
            "# TYPE vllm:e2e_request_latency_seconds histogram",
            # model a: no +Inf bucket, _count stands in for it
            'vllm:e2e_request_latency_seconds_bucket{le="0.5",model_name="a"} 1.0',
            'vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="a"} 3.0',
            'vllm:e2e_request_latency_seconds_count{model_name="a"} 4.0',
            'vllm:e2e_request_latency_seconds_sum{model_name="a"} 9.0',
            # model b: cumulative counts going down
            'vllm:e2e_request_latency_seconds_bucket{le="0.5",model_name="b"} 5.0',
            'vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="b"} 3.0',
            'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="b"} 6.0',
            # model c: an le that is no number
            'vllm:e2e_request_latency_seconds_bucket{le="soon",model_name="c"} 1.0',
            'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="c"} 1.0',
            "",
        ]
    )
    target = ScrapeTarget("http://127.0.0.1:8000/metrics", server="vllm")
    _, hists, result = convert(target, text, NOW_NS)
    (a,) = hists
    assert a.attributes["model"] == "a"
    assert (a.bounds, a.bucket_counts, a.sum_value) == ((0.5, 1.0), (1, 2, 1), 9.0)
    assert result.invalid_histograms == 2


# --- failures --------------------------------------------------------------------------------


def test_failing_targets_are_recorded_and_the_others_still_scraped(server, dead_url):
    broken = server.serve("/error", b"internal error\n", status=500)
    garbage = server.serve("/garbage", b"this is { not an exposition\n")
    good = server.serve("/metrics", page("triton"))
    targets = [ScrapeTarget(u, server="triton") for u in (broken, dead_url, garbage, good)]
    result = ModelServerScraper(targets, clock=lambda: NOW, timeout_seconds=2).scrape_once()

    assert [t.url for t in result.targets] == [broken, dead_url, garbage, good]
    assert [t.ok for t in result.targets] == [False, False, False, True]
    errors = [t.error or "" for t in result.failed]
    assert errors[0] == "HTTP 500 Internal Server Error"
    assert "refused" in errors[1].lower()
    assert errors[2]
    assert result.targets[3].points == 23
    assert {p.resource["service.instance.id"] for p in result.points} == {server.instance}


def test_a_failure_is_logged_once_per_streak(server, caplog):
    state = {"status": 503}
    server.httpd.routes["/flaky"] = lambda: (state["status"], page("vllm"), True)
    scraper = ModelServerScraper([ScrapeTarget(server.url("/flaky"), server="vllm")])
    caplog.set_level(logging.INFO, logger="gpuwarden.collector.ingest.scrape")

    def messages() -> list[tuple[str, str]]:
        return [(r.levelname, r.getMessage().split(": ")[0]) for r in caplog.records]

    for _ in range(3):
        assert scraper.scrape_once().failed
    state["status"] = 200
    assert not scraper.scrape_once().failed
    state["status"] = 500
    assert scraper.scrape_once().failed
    url = server.url("/flaky")
    assert messages() == [
        ("WARNING", f"scrape target {url} failed"),
        ("INFO", f"scrape target {url} recovered"),
        ("WARNING", f"scrape target {url} failed"),
    ]


def test_oversized_pages_are_refused(server):
    small = b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 1.0\n"
    urls = [
        server.serve("/sized", page("vllm")),  # refused on its Content-Length
        server.serve("/unsized", page("vllm"), sized=False),  # refused while reading
        server.serve("/small", small),
    ]
    targets = [ScrapeTarget(u, server="vllm") for u in urls]
    result = ModelServerScraper(targets, max_response_bytes=1024).scrape_once()
    assert [t.ok for t in result.targets] == [False, False, True]
    assert "exceeds 1024 bytes" in (result.targets[0].error or "")
    assert "exceeds 1024 bytes" in (result.targets[1].error or "")
    assert len(result.points) == 1

    def fetch(url: str, timeout: float) -> bytes:  # an injected fetcher is held to the cap too
        return page("vllm")

    injected = ModelServerScraper(targets[:1], fetch=fetch, max_response_bytes=1024)
    assert injected.scrape_once().failed[0].error == "response exceeds 1024 bytes"


def test_redirects_are_followed_to_http_only(server):
    # vLLM answers /metrics with a 307 to /metrics/ in some versions
    server.httpd.redirects["/metrics"] = "/metrics/"
    server.serve("/metrics/", page("vllm"))
    server.httpd.redirects["/ftp"] = "ftp://127.0.0.1/metrics"  # urllib itself would follow it
    server.httpd.redirects["/file"] = "file:///etc/passwd"
    paths = ("/metrics", "/ftp", "/file")
    result = ModelServerScraper(
        [ScrapeTarget(server.url(p), server="vllm") for p in paths]
    ).scrape_once()
    assert [t.ok for t in result.targets] == [True, False, False]
    assert result.targets[0].points == 13
    assert result.targets[1].error == "redirect to a non-HTTP URL refused: ftp://127.0.0.1/metrics"
    assert "file:///etc/passwd" in (result.targets[2].error or "")


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://127.0.0.1/metrics",
        "localhost:8000/metrics",
        "http:///metrics",
        "http://user:secret@127.0.0.1:8000/metrics",
        "http://127.0.0.1:99999/metrics",
    ],
)
def test_only_http_urls_are_scrape_targets(url):
    with pytest.raises(ValueError, match="scrape target"):
        ScrapeTarget(url, server="vllm")


def test_targets_know_their_instance_and_server_type():
    assert ScrapeTarget("https://vllm.example/metrics").instance == "vllm.example:443"
    assert ScrapeTarget("http://[::1]:8000/metrics").instance == "[::1]:8000"
    with pytest.raises(ValueError, match="server must be one of"):
        ScrapeTarget("http://127.0.0.1:8000/metrics", server="sglang")  # type: ignore[arg-type]
    labels = {"team": "a"}
    target = ScrapeTarget("http://127.0.0.1:8000/metrics", labels=labels)
    labels["team"] = "b"
    assert target.labels == {"team": "a"}  # a frozen copy


# --- the catalog and the docs ----------------------------------------------------------------


def test_the_docs_table_lists_exactly_the_mapped_metrics():
    rows = set()
    for line in DOC.read_text().splitlines():
        if not re.match(r"\| (vLLM|Triton|TGI) \|", line):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        ticked = [re.findall(r"`([^`]+)`", c) for c in cells]
        server = cells[0].lower()
        rows.add((server, ticked[1][0], cells[2].split()[0], ticked[3][0], ticked[5][0]))
    assert rows == {(m.server, m.source, m.source_type, m.name, m.unit) for m in MODEL_METRICS}


# --- into the collector ----------------------------------------------------------------------


def test_scraped_latency_lands_in_the_store_and_gives_quantiles(server, tmp_path):
    # a live vLLM-style endpoint, rendered by prometheus_client as vLLM does
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    latency = Histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        labels,
        buckets=LATENCY,
        registry=registry,
    )
    success = Counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        [*labels, "finished_reason"],
        registry=registry,
    )
    server.httpd.routes["/metrics"] = lambda: (200, generate_latest(registry), True)
    now = time.time()
    times = iter([now - 30, now - 10])
    target = ScrapeTarget(server.url("/metrics"), server="vllm", node="gpu-1")
    scraper = ModelServerScraper([target], clock=lambda: next(times))
    service = build_service(CollectorConfig(database=tmp_path / "c.db"))
    try:
        for _ in range(10):
            latency.labels("llama", "0").observe(0.4)
            success.labels("llama", "0", "stop").inc()
        assert scraper.scrape_once().accept_into(service) == 0
        for _ in range(100):  # between the scrapes: 100 requests in (1.0, 1.5]
            latency.labels("llama", "0").observe(1.2)
            success.labels("llama", "0", "stop").inc()
        assert scraper.scrape_once().accept_into(service) == 0

        common: dict[str, AttrValue] = {"model": "llama", "engine": "0", "host.name": "gpu-1"}
        common["service.instance.id"] = server.instance
        key = series_key("gpuwarden.model.request.latency", common)
        # rank 99 of the 100 new observations, interpolated in (1.0, 1.5]
        assert service.store.quantile(key, 0.99, now - 25, now + 1) == pytest.approx(1.495)
        requests = series_key(
            "gpuwarden.model.requests", {**common, "reason": "stop", "outcome": "success"}
        )
        assert service.store.increase(requests, now - 25, now + 1) == pytest.approx(100.0)
        assert "gpu-1" not in service.nodes  # a scrape does not stand for the node's agent
    finally:
        service.storage.close()
