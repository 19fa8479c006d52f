"""A detection cycle in a forked child process, so that it never takes the collector's CPU lock.

Why a process. Detection is mostly numpy, but a cycle over a large fleet also runs a lot of
Python (per GPU, per job, per finding), and a thread of the collector's process that runs Python
holds the GIL: the event loop and the request handlers wait for it, and for the store's lock while
a detector reads a big matrix. Measured on 4,000 GPUs, a cycle in a worker thread starved ingest
(p99 10 s). A child process has its own GIL and runs on the other core.

How. Each cycle forks (``os.fork``): the child sees the store, jobs and caches as they were at the
fork (copy-on-write, nothing is copied up front), runs every rule and sends back, pickled through
a pipe, what the parent needs: the findings, the failed rules, the seconds per rule, and the
detectors' caches (fits, trackers) it changed. The parent folds the findings into incidents
(storage is only ever written by the parent) and keeps the returned caches for the next cycle.
The fork itself happens with the store's and the job registry's locks held (the view's
``exclusive``), so no other thread is half-way through them in the child's copy, and the child
never touches storage: what detectors read from it (deployments, events of the last
``events_lookback_seconds``) is read in the parent before the fork (:class:`ForkContext`).

The price. (1) Memory and page copies: a page of private memory the parent writes while a
child lives is copied first (copy-on-write). The store's recent ring and counter intervals are
shared mappings (``store.ring``: the child sees the parent's later writes there, within the
bounds that module states), so ingest copies no page of them; the long ring (one column a
minute) and the Python heap stay private. Measured at 1,000 GPUs (``bench.detect_cycle
--probe-ingest``): with private rings, moving the head copied 90,000 pages under the store's
lock and stalled ingest 0.47-0.81 s once a cycle; shared, the probe's max was 52-89 ms.
(2) Latency: the fork copies the page tables of the private mappings under the store's lock
(20-90 ms at 1,000 GPUs; shared mappings' are not copied). (3) Findings and caches cross a
pipe, pickled: 87 MiB at 1,000 GPUs with 16 models, 85 of them demand-forecast's fits, which
change every cycle (each fit appends the new bins). The parent unpickles the findings (with the
garbage collector paused) but keeps each cache as the child pickled it (:class:`Packed`): the
next child unpickles what it uses, so the fits never become objects of the parent's heap.
Stopping: :meth:`ForkedCycles.stop` kills a running child (SIGKILL), so the collector stops
within a second whatever the cycle was doing; a child that runs past ``timeout_seconds`` is
killed too and the cycle counts as failed.
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import os
import pickle
import resource
import select
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractContextManager
from types import MappingProxyType
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

import numpy as np

from gpuwarden.collector.accounting.gpu_time import GpuRef, GpuTimeline
from gpuwarden.collector.budgets.calendar import month_bounds
from gpuwarden.collector.budgets.config import Budgets
from gpuwarden.collector.budgets.spend import WindowSpend
from gpuwarden.collector.detect.contract import DetectionContext
from gpuwarden.collector.jobs.kueue_workloads import KueueWorkload
from gpuwarden.collector.jobs.model import Job
from gpuwarden.collector.storage.records import Event, EventKind, ModelDeployment
from gpuwarden.collector.store.window import WindowStore

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
C = TypeVar("C")

EVENTS_LOOKBACK_SECONDS = 14 * 86400.0
"""Events read before the fork: as far back as the store's default long window."""


class CycleStoppedError(Exception):
    """The cycle's child was stopped (the collector is stopping): nothing came back."""


@runtime_checkable
class _HasExclusive(Protocol):
    """A view that can hold off every other thread from what detectors read, for a fork."""

    def exclusive(self) -> AbstractContextManager[None]:
        """Hold the locks of the store and the job registry."""
        ...


class ForkContext:
    """A :class:`DetectionContext` for forked cycles: ``inner``'s reads, except that storage
    reads come from :meth:`prefetch` (done in the parent) and the detectors' caches are kept
    here, so :meth:`caches` can be sent back from the child and :meth:`restore`d in the parent.
    """

    def __init__(
        self, inner: DetectionContext, *, events_lookback_seconds: float = EVENTS_LOOKBACK_SECONDS
    ) -> None:
        self._inner = inner
        self._lookback = events_lookback_seconds
        self._deployments: list[ModelDeployment] | None = None
        self._events: list[Event] | None = None
        self._events_since = 0.0
        self._spend: dict[tuple[float, float], WindowSpend] = {}
        self._caches: dict[object, object] = {}
        self._lock = threading.Lock()
        # The service's view holds what was read at start (level-shift's fits) and writes
        # the fits with every snapshot: both go through this context from now on.
        share = getattr(inner, "share_caches", None)
        if share is not None:
            share(self.cache)

    def prefetch(self, now: float, spend_windows_seconds: Collection[float] = ()) -> None:
        """Read the deployments, recent events and the spend windows ending at ``now`` the
        rules read, month-to-date included (in the parent, before a fork)."""
        self._events_since = now - self._lookback
        self._deployments = self._inner.deployments()
        self._events = self._inner.events(since=self._events_since, kinds=tuple(EventKind))
        self._spend = {}
        if spend_windows_seconds and self._inner.budgets().items:
            starts = {now - w for w in spend_windows_seconds} | {month_bounds(now)[0]}
            self._spend = {(s, now): self._inner.spend(since=s, until=now) for s in starts}

    def budgets(self) -> Budgets:
        """The inner view's budgets."""
        return self._inner.budgets()

    def spend(self, *, since: float, until: float) -> WindowSpend:
        """The prefetched spend of the window (the inner view's when it was not prefetched)."""
        got = self._spend.get((since, until))
        return got if got is not None else self._inner.spend(since=since, until=until)

    def exclusive(self) -> AbstractContextManager[None]:
        """The inner view's locks (none if it has none)."""
        inner = self._inner
        if isinstance(inner, _HasExclusive):
            return inner.exclusive()
        return contextlib.nullcontext()

    @property
    def store(self) -> WindowStore:
        """The inner view's store."""
        return self._inner.store

    def now(self) -> float:
        """The inner view's clock."""
        return self._inner.now()

    def gpus(self) -> list[GpuRef]:
        """The inner view's GPUs."""
        return self._inner.gpus()

    def timelines(self, start: float, end: float) -> tuple[np.ndarray, list[GpuTimeline]]:
        """The inner view's timelines."""
        return self._inner.timelines(start, end)

    def jobs(self) -> list[Job]:
        """The inner view's jobs."""
        return self._inner.jobs()

    def kueue_workloads(self) -> list[KueueWorkload]:
        """The inner view's Kueue Workloads (a child: as they were at the fork)."""
        return self._inner.kueue_workloads()

    def job(self, key: str) -> Job | None:
        """The inner view's job."""
        return self._inner.job(key)

    def resolve_job(self, scheduler: str, ident: str, node: str) -> str:
        """The inner view's job key."""
        return self._inner.resolve_job(scheduler, ident, node)

    def deployments(self) -> list[ModelDeployment]:
        """The deployments prefetched (the inner view's when nothing was)."""
        if self._deployments is None:
            return self._inner.deployments()
        return list(self._deployments)

    def events(self, *, since: float, kinds: Collection[EventKind]) -> list[Event]:
        """The prefetched events of ``kinds`` at or after ``since`` (at most the lookback)."""
        if self._events is None:
            return self._inner.events(since=since, kinds=kinds)
        wanted = set(kinds)
        return [e for e in self._events if e.time >= since and e.kind in wanted]

    def price(self, gpu_model: str, tier: str, cluster: str | None = None) -> float:
        """The inner view's price."""
        return self._inner.price(gpu_model, tier, cluster)

    @property
    def default_price_tier(self) -> str:
        """The inner view's default tier."""
        return self._inner.default_price_tier

    @property
    def fairness_targets(self) -> Mapping[str, float]:
        """The inner view's fairness targets."""
        return self._inner.fairness_targets

    def cache(self, kind: Callable[[], C]) -> C:
        """The detector state of this kind, made on first use (kept here, see the class); one
        a child sent back is unpickled here on first use (:class:`Packed`)."""
        with self._lock:
            value = self._caches.get(kind)
            if value is None:  # the inner view's own (read at start), else a new one
                own = getattr(self._inner, "own_cache", None)
                value = self._caches[kind] = own(kind) if own is not None else kind()
            elif isinstance(value, Packed):
                value = self._caches[kind] = pickle.loads(value.data)  # noqa: S301 - our child's
            return cast("C", value)

    def caches(self) -> dict[object, object]:
        """Every cache, by kind, each pickled on its own (what a child sends back)."""
        with self._lock:
            return {
                kind: value if isinstance(value, Packed) else Packed(dumps(value))
                for kind, value in self._caches.items()
            }

    def restore(self, caches: dict[object, object]) -> None:
        """Take the caches a child sent back (still pickled: see :class:`Packed`)."""
        with self._lock:
            self._caches = dict(caches)


class Packed:
    """A detector cache as a child pickled it, kept so in the parent until something uses it.

    The parent never reads most caches: the next cycle's child does. Unpickled in the parent,
    demand-forecast's fits alone (85 MiB at 1,000 or 10,000 GPUs with 16 models) were millions
    of objects made while the parent held its GIL (ingest waited 0.4-0.7 s for the full
    collections they set off, two to four a cycle, at 10,000 GPUs), for the parent to keep and
    the collector to walk until the next child sent new ones. Kept as one ``bytes``, they cost
    the parent a copy; the child that uses them unpickles them (off the event loop)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self) -> tuple[type[Packed], tuple[bytes]]:
        return (Packed, (self.data,))


def _same(value: T) -> T:
    return value


class _Pickler(pickle.Pickler):
    """Pickles read-only mappings (findings' evidence, jobs' labels) as their copies, without
    registering anything process-wide."""

    def reducer_override(self, obj: object) -> Any:
        if type(obj) is MappingProxyType:
            return (read_only, (dict(obj),))
        return NotImplemented


def read_only(items: dict[object, object]) -> MappingProxyType[object, object]:
    """A read-only mapping of ``items`` (how :class:`_Pickler`'s mappings are unpickled)."""
    return MappingProxyType(items)


def dumps(value: object) -> bytes:
    """``value`` pickled, read-only mappings included."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


class ForkedCycles:
    """Runs one piece of work at a time in a forked child and returns its pickled result.

    Args:
        exclusive: held while forking (the store's and registry's locks), see the module.
        timeout_seconds: a child still running after this long is killed (the cycle fails).
    """

    def __init__(
        self,
        exclusive: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
        *,
        timeout_seconds: float = 600.0,
    ) -> None:
        self._exclusive = exclusive
        self._timeout = timeout_seconds
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._stopped = False
        self.child_cpu_seconds = 0.0
        """CPU seconds (user + system) of the last child, once it ended."""
        self.fork_seconds = 0.0
        """How long the last fork held the locks (``exclusive`` taken, then ``os.fork``)."""
        self.result_bytes = 0
        """Size of the last child's pickled result."""
        self.parent_faults = (0, 0)
        """Page faults (minor, major) of this process, every thread, while the last child
        lived: copy-on-write copies of pages this process wrote while the child still shared
        them, among others (``resource.getrusage``)."""
        self.loads_seconds = 0.0
        """How long unpickling the last child's result took here (the GIL held throughout)."""
        self.phases: dict[str, tuple[float, float]] = {}
        """``time.perf_counter`` spans of the last run here: ``fork`` (locks taken, then
        ``os.fork``), ``child`` (until its result was read), ``loads`` (unpickling it)."""

    def stop(self) -> None:
        """Kill the running child, if any, and refuse to start another."""
        with self._lock:
            self._stopped = True
            pid = self._pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def run(self, work: Callable[[], T]) -> T:
        """``work()`` run in a child; its result, unpickled.

        Raises:
            CycleStoppedError: :meth:`stop` was called (before or while the child ran).
            RuntimeError: the child failed (the message holds its traceback), or timed out.
        """
        return self.run_then(work, _same)

    def run_then(self, work: Callable[[], T], then: Callable[[T], R]) -> R:
        """``then(work())``: ``work`` run in a child, ``then`` here on its unpickled result.

        The garbage collector is paused from the unpickling to ``then``'s end: the result's
        objects are all made at once and, once ``then`` has used them, freed by their reference
        counts. A collection among them would walk them all, and promote them until a full
        collection walked the whole heap too: 0.4-0.7 s with the GIL held at 10,000 GPUs, two
        to four times a cycle, while ingest waited. Raises as :meth:`run` does, and what
        ``then`` raises.
        """
        data, read = self._run_child(work)
        collecting = gc.isenabled()
        gc.disable()
        try:
            result = cast("T", pickle.loads(data))  # noqa: S301 - our own child's result
            self.loads_seconds = time.perf_counter() - read
            self.phases["loads"] = (read, read + self.loads_seconds)
            return then(result)
        finally:
            if collecting:
                gc.enable()

    def _run_child(self, work: Callable[[], object]) -> tuple[bytes, float]:
        """``work()`` run in a child: its pickled result and when it was read."""
        read_fd, write_fd = os.pipe()
        with self._lock:
            if self._stopped:
                os.close(read_fd)
                os.close(write_fd)
                raise CycleStoppedError
            began = time.perf_counter()
            faults_began = resource.getrusage(resource.RUSAGE_SELF)
            with self._exclusive(), warnings.catch_warnings():
                # Python 3.12+ warns that forking a threaded process may deadlock the child on a
                # lock another thread held: the locks the child uses are held here (module doc)
                warnings.filterwarnings("ignore", ".*fork", DeprecationWarning)
                pid = os.fork()
            if pid:
                forked = time.perf_counter()
                self.fork_seconds = forked - began
            if pid == 0:  # the child: no return from this branch
                os.close(read_fd)
                self._child(work, write_fd)
            self._pid = pid
        os.close(write_fd)
        try:
            data = self._read(read_fd, pid)
        finally:
            os.close(read_fd)
            _, status, usage = os.wait4(pid, 0)
            read = time.perf_counter()
            faults = resource.getrusage(resource.RUSAGE_SELF)
            self.parent_faults = (
                faults.ru_minflt - faults_began.ru_minflt,
                faults.ru_majflt - faults_began.ru_majflt,
            )
            self.child_cpu_seconds = usage.ru_utime + usage.ru_stime
            with self._lock:
                self._pid = None
                stopped = self._stopped
        if stopped:
            raise CycleStoppedError
        if data is None:
            raise RuntimeError(f"the detection child ran past {self._timeout:.0f} s: killed")
        self.result_bytes = len(data)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            text = data.decode(errors="replace") if code == 1 else ""
            raise RuntimeError(f"the detection child failed (exit {code}): {text}")
        self.phases = {"fork": (began, forked), "child": (forked, read)}
        return data, read

    def _read(self, fd: int, pid: int) -> bytes | None:
        """Everything the child writes, or None when it ran past the timeout (then killed)."""
        deadline = time.monotonic() + self._timeout
        chunks: list[bytes] = []
        while True:
            remaining = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, remaining))
            if not ready:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)

    @staticmethod
    def _child(work: Callable[[], object], fd: int) -> None:
        """Run ``work`` and write its pickled result (exit 0), or its traceback (exit 1)."""
        code = 1
        try:
            try:
                data, code = dumps(work()), 0
            except BaseException:  # noqa: BLE001 - the child's one broad except: the parent raises it
                data = traceback.format_exc().encode()
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        finally:
            os._exit(code)
