"""The Prometheus remote-write receiver: ``POST /api/v1/write`` (remote-write 1.0).

Any Prometheus, vmagent, Grafana Agent/Alloy or OpenTelemetry Collector (``prometheusremotewrite``
exporter) can feed the collector this way. A request is a snappy-compressed (block format)
protobuf ``WriteRequest`` (``remote_write.wire``). It is screened under the per-request limits
(``ingest.prom_write``), its series are turned into our metrics by the *translator* this module
is given (the mapping table of dcgm-exporter and model-server names; a series it has no mapping
for is skipped and counted), and the points are stored under the sender's series budget like the
OTLP receiver's, but never handed to the remote-write history writer (unless
``remote_write.forward_received``): they came from a TSDB's feed and would be written back.

Answers (``docs/limits.md``): 204 when the request was read, whatever became of single samples
(NaN/Inf, series over the label limits or the series budget, series without a mapping: dropped
and counted, as VictoriaMetrics does; a resend would not change them); 400 for a body that is
not a snappy ``WriteRequest``, or holds a series that is no Prometheus series (no ``__name__``,
a bad label name: ``ingest.prom_write``), or one the translator fails on (logged with its
traceback; a 5xx would have the sender resend it forever), nothing stored (never worth a
retry); 401/403 from the authentication middleware; 403 for a node the agent's token is not
bound to (nothing stored); 413 for a body, an inflated body (the snappy header is read first: a
decompression bomb never inflates), series or samples over the limits; 415 for another content
type or encoding (remote-write 2.0's ``proto=`` included); 503 with ``Retry-After`` when too
many requests, or too many of one caller, are being stored.

Requests are decoded and stored in the receiver's own threads, one per core the process may run
on (``worker_count``): more would only take turns on the same cores and the same locks (the
label-set cache's, the store's), at a cost (``docs/performance.md``); the requests beyond wait
for one, within the in-flight limits. A thread takes every request waiting at once: those of
one caller read flat are mapped and stored together (``prom_columns.store_many``: each mapped
as if alone, one write), which pays a request's fixed cost once for all of them; each still
gets its own answer.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from gpuwarden.collector.config import CollectorConfig
from gpuwarden.collector.ingest.otlp import NumberPoint
from gpuwarden.collector.ingest.prom_columns import (
    ColumnMapper,
    LabelSetCache,
    LabelSetColumns,
    NodeRefusedError,
    SeriesMapper,
    Stored,
    store_many,
)
from gpuwarden.collector.ingest.prom_write import (
    LabelVerdicts,
    MalformedRequestError,
    RequestTooLargeError,
    screen,
)
from gpuwarden.collector.ingest.sink import MetricsSink
from gpuwarden.collector.remote_write.wire import (
    Decoder,
    Series,
    WireError,
    WireTooLargeError,
    series_of,
)
from gpuwarden.collector.remote_write.wire_flat import FlatRequest
from gpuwarden.collector.service import CollectorService
from gpuwarden.collector.web.guard import busy, inflight_slot
from gpuwarden.collector.web.keys import (
    AGENTS,
    AUTH_STATS,
    CALLER,
    CONFIG,
    SINK,
    STATS,
    Caller,
    add_route,
)

log = logging.getLogger(__name__)

PROTOBUF = "application/x-protobuf"
WRITE_V1 = "prometheus.WriteRequest"
"""The ``proto=`` parameter remote-write 2.0 senders put on a 1.0 request (the only one taken)."""
RETRY_AFTER_SECONDS = 2
MAX_LABEL_SETS = 100_000
"""Label sets whose decoding and checks are remembered (forgotten all at once beyond): about
2.7 KiB each with dcgm-exporter's labels, so at most ~270 MiB."""


class Translated(Protocol):
    """What a translator gives back: our points, and how many series it had no mapping for."""

    @property
    def points(self) -> Sequence[NumberPoint]: ...
    @property
    def skipped(self) -> int: ...


class Translator(Protocol):
    """Turns remote-written series (Prometheus names and labels) into our metrics' points."""

    def __call__(self, series: Sequence[Series], /) -> Translated: ...


@dataclass(frozen=True)
class RemoteWriteState:
    """What the receiver remembers of the label sets seen: their decoding (``decoder``) and
    what the label checks said (``verdicts``), so a series sent every scrape is decoded and
    checked once; with a translator that maps requests as columns
    (``prom_columns.ColumnMapper``, as the production ``prom_map_columns.PromTranslator`` does)
    or series one by one (``prom_columns.SeriesMapper``) also their mapping and our series'
    store rows (``columns``). Its counters are ``IngestStats.remote_write_samples``."""

    decoder: Decoder
    verdicts: LabelVerdicts
    columns: LabelSetCache | None = None


TRANSLATOR: web.AppKey[Translator] = web.AppKey("prom_translator")
RW_STATE = web.AppKey("remote_write_state", RemoteWriteState)
RW_WORKERS = web.AppKey("remote_write_workers", ThreadPoolExecutor)


@dataclass(eq=False)
class _Waiting:
    """A request waiting for a worker: its body, its caller, where its answer goes (a future of
    ``loop``'s: (stored, rejected) samples, or ``_RefusedError``), and the answer the worker
    found (``outcome``), handed to the loop once for all the requests of a turn."""

    body: bytes
    caller: Caller
    answer: asyncio.Future[tuple[int, int]]
    loop: asyncio.AbstractEventLoop
    outcome: tuple[int, int] | Exception | None = None


class _Queue:
    """The requests waiting for a worker; a worker takes all of them at once (module
    docstring: requests in flight together are stored together)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[_Waiting] = []

    def __len__(self) -> int:
        with self._lock:
            return len(self._waiting)

    def put(self, waiting: _Waiting) -> None:
        with self._lock:
            self._waiting.append(waiting)

    def take(self) -> list[_Waiting]:
        """Every request waiting, in arrival order, except those whose handler was cancelled
        (never stored, as a job an executor had not started)."""
        with self._lock:
            taken, self._waiting = self._waiting, []
        return [w for w in taken if not w.answer.cancelled()]


RW_QUEUE = web.AppKey("remote_write_queue", _Queue)


def worker_count() -> int:
    """Threads that decode and store requests: one per core this process may run on (its CPU
    affinity, as ``taskset`` or a cpuset sets it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform
        return max(1, os.cpu_count() or 1)


class _RefusedError(Exception):
    """An answer other than 204: its status and one line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _check_headers(request: web.Request) -> None:
    """415 unless a remote-write 1.0 request: protobuf (``proto=`` absent or 1.0's), snappy."""
    media, _, params = (request.headers.get("Content-Type") or "").partition(";")
    if media.strip().lower() != PROTOBUF:
        raise _RefusedError(415, f"Content-Type must be {PROTOBUF} (remote-write 1.0)")
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "proto" and value.strip().strip('"') != WRITE_V1:
            raise _RefusedError(415, f"only proto={WRITE_V1} (remote-write 1.0) is taken")
    encoding = (request.headers.get("Content-Encoding") or "").strip().lower()
    if encoding != "snappy":
        raise _RefusedError(415, "Content-Encoding must be snappy")


async def remote_write(request: web.Request) -> web.Response:
    """``POST /api/v1/write``: one remote-write 1.0 request (module docstring for the answers).

    The body is buffered by ``web.guard.body_guard`` before this runs; decoding, translating
    and storing run in one of the receiver's threads (``RW_WORKERS``) holding an in-flight slot,
    so the event loop serves everyone else meanwhile.
    """
    config, stats = request.app[CONFIG], request.app[STATS]
    caller = request[CALLER]
    try:
        _check_headers(request)
        body = await _read(request, config.max_body_bytes)
        reason = busy(config, stats, caller.name)
        if reason is not None:
            stats.responses[503] += 1
            return web.Response(
                status=503,
                text=f"{reason}, retry later\n",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        with inflight_slot(stats, caller.name):
            loop = asyncio.get_running_loop()
            waiting = _Waiting(body, caller, loop.create_future(), loop)
            queue = request.app[RW_QUEUE]
            queue.put(waiting)
            work = functools.partial(
                _take_and_store,
                queue,
                request.app[SINK],
                request.app[TRANSLATOR],
                request.app[RW_STATE],
                stats.remote_write_samples,
                config,
            )
            context = contextvars.copy_context()  # as asyncio.to_thread does
            # this request's own turn: it finds the request, or finds it taken by a turn
            # before it (then the queue may be empty)
            request.app[RW_WORKERS].submit(context.run, work)
            stored, rejected = await waiting.answer
    except _RefusedError as exc:
        stats.responses[exc.status] += 1
        if exc.status == 403:  # a node the token is not bound to, counted as OTLP's are
            request.app[AUTH_STATS].count(request, 403, "node")
        return web.Response(status=exc.status, text=exc.message + "\n")
    stats.points_accepted += stored
    stats.points_rejected += rejected
    stats.responses[204] += 1
    return web.Response(status=204)


async def _read(request: web.Request, limit: int) -> bytes:
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _RefusedError(413, f"body exceeds {limit} bytes") from None
    if len(body) > limit:
        raise _RefusedError(413, f"body exceeds {limit} bytes")
    return body


def _take_and_store(
    queue: _Queue,
    sink: MetricsSink,
    translate: Translator,
    state: RemoteWriteState,
    outcomes: Counter[str],
    config: CollectorConfig,
) -> None:
    """A worker's turn: take every request waiting and answer each (module docstring); the
    answers go to each event loop in one call (one wake-up a turn, not one a request)."""
    taken = queue.take()
    if not taken:
        return
    try:
        _store_all(taken, sink, translate, state, outcomes, config)
    except Exception:  # a bug: the requests still answered (a 500), never left waiting
        log.exception("remote-write: a worker failed; %d request(s) answered 500", len(taken))
        for waiting in taken:
            if waiting.outcome is None:
                waiting.outcome = _RefusedError(500, "the collector failed on this request")
    finally:
        for loop in {id(w.loop): w.loop for w in taken}.values():
            mine = [w for w in taken if w.loop is loop]
            try:
                loop.call_soon_threadsafe(_answer, mine)
            except RuntimeError:  # the loop is closed: nobody waits any more
                continue


def _answer(taken: list[_Waiting]) -> None:
    """On the event loop: each request's outcome to its handler (unless it was cancelled)."""
    for waiting in taken:
        if waiting.answer.done():
            continue
        outcome = waiting.outcome
        if isinstance(outcome, Exception):
            waiting.answer.set_exception(outcome)
        elif outcome is None:  # cannot happen: ``_store_all`` answers each
            waiting.answer.set_exception(RuntimeError("a remote-write request got no answer"))
        else:
            waiting.answer.set_result(outcome)


def _store_all(
    taken: list[_Waiting],
    sink: MetricsSink,
    translate: Translator,
    state: RemoteWriteState,
    outcomes: Counter[str],
    config: CollectorConfig,
) -> None:
    """Decode each request; those read flat go through the columns, one write for those of
    one caller and decoder table (``prom_columns.store_many``); the others one by one."""
    forward = config.remote_write is not None and config.remote_write.forward_received
    columns = state.columns
    service = sink if isinstance(sink, CollectorService) and not forward else None
    flat: dict[tuple[Caller, int], list[tuple[_Waiting, FlatRequest]]] = {}
    for waiting in taken:
        try:
            got = _decode(waiting.body, state, config)
            if isinstance(got, FlatRequest):
                if columns is not None and service is not None:
                    flat.setdefault((waiting.caller, got.generation), []).append((waiting, got))
                    continue
                got = series_of(got)
            done = _store_series(got, sink, translate, state, outcomes, waiting.caller, config)
        except _RefusedError as exc:
            waiting.outcome = exc
            continue
        waiting.outcome = done
    if columns is None or service is None:
        return  # no request went to the columns
    limit = config.ingest_limits.max_points_per_request
    for (caller, _), group in flat.items():
        requests = [
            LabelSetColumns(f.ids, f.timestamps_ms, f.values, f.label_sets, f.generation)
            for _, f in group
        ]
        answers = store_many(requests, columns, service, caller.may_write, limit, caller.name)
        for (waiting, got), answer in zip(group, answers, strict=True):
            try:
                if answer is None:  # the columns declined: series by series
                    done = _store_series(
                        series_of(got), sink, translate, state, outcomes, caller, config
                    )
                elif isinstance(answer, Stored):
                    _count(outcomes, answer.outcomes, caller, answer.rejected)
                    done = (answer.stored, answer.rejected)
                else:
                    raise _refusal(answer, caller)
            except _RefusedError as exc:
                waiting.outcome = exc
                continue
            waiting.outcome = done


def _decode(
    body: bytes, state: RemoteWriteState, config: CollectorConfig
) -> FlatRequest | list[Series]:
    try:
        return state.decoder.decode_flat(body, config.max_decompressed_bytes)
    except WireTooLargeError as exc:
        raise _RefusedError(413, str(exc)) from None
    except WireError as exc:
        raise _RefusedError(400, f"malformed remote-write body: {exc}") from None


def _refusal(error: Exception, caller: Caller) -> _RefusedError:
    """The answer to a request the columns refused (``prom_columns.store_many``)."""
    if isinstance(error, RequestTooLargeError):
        return _RefusedError(413, str(error))
    if isinstance(error, MalformedRequestError):
        return _RefusedError(400, f"malformed remote-write request: {error}")
    if isinstance(error, NodeRefusedError):
        return _RefusedError(
            403, f"{caller} may not write host.name {error.host!r}; nothing stored"
        )
    log.error(
        "remote-write from %s: the translator failed; request refused", caller, exc_info=error
    )
    return _RefusedError(400, "the collector could not map this request's series")


def _count(outcomes: Counter[str], counts: Counter[str], caller: Caller, rejected: int) -> None:
    outcomes.update(counts)
    if rejected:
        log.debug("remote-write from %s: %d sample(s) rejected (%s)", caller, rejected, counts)


def _store_series(
    series: list[Series],
    sink: MetricsSink,
    translate: Translator,
    state: RemoteWriteState,
    outcomes: Counter[str],
    caller: Caller,
    config: CollectorConfig,
) -> tuple[int, int]:
    """Screen, translate and store decoded series (the path for every request the columns do
    not take)."""
    try:
        screened = screen(series, config.ingest_limits, state.verdicts)
    except RequestTooLargeError as exc:
        raise _RefusedError(413, str(exc)) from None
    except MalformedRequestError as exc:
        raise _RefusedError(400, f"malformed remote-write request: {exc}") from None
    try:
        translated = translate(screened.series)
        ended = translate(screened.stale).points if screened.stale else ()
    except Exception:  # a mapping bug: a 5xx would have the sender resend this batch forever
        log.exception("remote-write from %s: the translator failed; request refused", caller)
        raise _RefusedError(400, "the collector could not map this request's series") from None
    points = translated.points
    hosts = {p.resource.get("host.name", "") for part in (points, ended) for p in part}
    unbound = sorted(str(h) for h in hosts if not caller.may_write(str(h)))
    if unbound:
        raise _RefusedError(403, f"{caller} may not write host.name {unbound[0]!r}; nothing stored")
    forward = config.remote_write is not None and config.remote_write.forward_received
    if isinstance(sink, CollectorService):
        refused = sink.accept(points, caller.name, history=forward)
        if ended:  # after the values: a marker ends what came before it
            sink.end_series(ended)
    else:
        refused = sink.accept(points, caller.name)
    for outcome, n in (
        ("stored", len(points) - refused),
        ("refused_by_store", refused),
        ("nonfinite", screened.nonfinite),
        ("over_label_limits", screened.over_limits),
        ("stale_markers", screened.stale_markers),
        ("unmapped_series", translated.skipped),
    ):
        if n:
            outcomes[outcome] += n
    if screened.rejected or refused:
        log.debug(
            "remote-write from %s: %d sample(s) rejected (%d non-finite, %d over the label "
            "limits, %d refused by the store)",
            caller,
            screened.rejected + refused,
            screened.nonfinite,
            screened.over_limits,
            refused,
        )
    return len(points) - refused, screened.rejected + refused


def setup_remote_write(app: web.Application, translate: Translator) -> None:
    """Add ``POST /api/v1/write`` (agents, like OTLP), storing into ``app[SINK]`` through
    ``translate``."""
    app[TRANSLATOR] = translate
    verdicts = LabelVerdicts(app[CONFIG].ingest_limits, MAX_LABEL_SETS)
    columns = (
        LabelSetCache(verdicts, translate)
        if isinstance(translate, (ColumnMapper, SeriesMapper))
        else None
    )
    app[RW_STATE] = RemoteWriteState(Decoder(MAX_LABEL_SETS), verdicts, columns)
    # threads start at the first request; the app's cleanup lets them go
    app[RW_WORKERS] = ThreadPoolExecutor(worker_count(), thread_name_prefix="remote-write")
    app[RW_QUEUE] = _Queue()
    app.on_cleanup.append(_stop_workers)
    add_route(app, "POST", "/api/v1/write", remote_write, AGENTS)


async def _stop_workers(app: web.Application) -> None:
    """An ``on_cleanup`` hook: the threads end once their request is done (never waited for
    here; aiohttp's shutdown already waited for the requests in progress)."""
    app[RW_WORKERS].shutdown(wait=False, cancel_futures=True)
