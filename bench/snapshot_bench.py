"""WindowStore snapshot benchmark: size, write time and read time for a realistic store.

Run: ``.venv/bin/python -m bench.snapshot_bench [--days 14] [--agents 63]`` (``--days 14``
needs about 4 GB at 63 agents).

63 agents x 8 GPUs (504 GPUs) x the 40 catalog series per GPU of ``store_bench`` (5 counters,
3 per-process series): 20,160 series at the default shape (10 s for 6 h, 1 min for 14 days).
Two rounds go through ``ingest`` (series, counters' raw state); then the rings are filled
directly with random values, as a collector up for ``--hours`` (the recent ring full after 6 h)
or ``--days`` (the long ring full after 14) would hold them: random floats are the worst case
for any compression, and NaN (never written) costs the same bytes in an uncompressed ``.npz``.
Prints the snapshot's size, the time to write it (temporary file, fsync, rename), the time to
read it into an empty store, and how long one agent's requests, pushed all the while, waited.

Then the snapshot at shutdown: every agent pushes ``--changes-minutes`` (default 5, the default
``snapshot_seconds``) more of rounds, and only the changes since the full snapshot are written
(``write_snapshot(changes_only=True)``, what SIGTERM writes): their size and time, and the time
to read the full snapshot and the changes into an empty store. ``--agents 1250`` is 10,000 GPUs
(400,000 series; keep ``--hours`` small there: the rings are allocated for 6 h and 14 days).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.store_bench import GPUS, T0, agent_request, agent_templates
from gpuwarden.collector.store.ring import encode
from gpuwarden.collector.store.window import WindowStore

AGENTS = 63
STEP_S = 10


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def build(hours: float, agents: int) -> tuple[WindowStore, Clock]:
    """A default-shaped store with every series and ``hours`` of data in its rings."""
    now = T0 + hours * 3600
    clock = Clock(now)
    store = WindowStore(step_seconds=STEP_S, clock=clock, max_series=2_000_000)
    rnd = random.Random(7)
    templates = [agent_templates(a) for a in range(agents)]
    totals = [0.0] * (agents * len(templates[0]))
    for k in (1, 0):  # the newest round last
        t_ns = int((now - k * STEP_S) * 1e9)
        for agent in range(agents):
            store.ingest(agent_request(agent, templates[agent], t_ns, rnd, totals))
    table = store._table
    rows = table.next_row
    values = np.random.default_rng(7)
    for ring, step in ((table.recent, STEP_S), (table.long, store.long_step_seconds)):
        held = min(ring.n_slots, int(hours * 3600 // step))
        head = int(ring.head or 0)
        cols = np.arange(head - held + 1, head + 1) % ring.n_slots
        for start in range(0, rows, 1024):
            block = values.random((min(1024, rows - start), held), dtype=np.float32)
            ring.bits[start : start + block.shape[0], cols] = encode(block)
    table.first_slot = int(now // STEP_S) - int(hours * 3600 // STEP_S) + 1
    return store, clock


def push_minutes(store: WindowStore, clock: Clock, agents: int, minutes: float) -> None:
    """Every agent's rounds for ``minutes`` more (the clock moves with them)."""
    rnd = random.Random(9)
    templates = [agent_templates(a) for a in range(agents)]
    totals = [1e6] * (agents * len(templates[0]))
    for _ in range(int(minutes * 60 // STEP_S)):
        clock.now += STEP_S
        t_ns = int(clock.now * 1e9)
        for agent in range(agents):
            store.ingest(agent_request(agent, templates[agent], t_ns, rnd, totals))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hours", type=float, default=6.0, help="time the store has been up")
    parser.add_argument("--days", type=float, help="days up (overrides --hours)")
    parser.add_argument("--agents", type=int, default=AGENTS, help="agents of 8 GPUs")
    parser.add_argument("--changes-minutes", type=float, default=5.0, help="data after the full")
    args = parser.parse_args()
    hours = args.days * 24 if args.days is not None else args.hours
    store, clock = build(hours, args.agents)
    now = clock.now
    # one agent keeps pushing while the snapshot is written: how long does ingest wait?
    rnd = random.Random(8)
    template = agent_templates(0)
    totals = [0.0] * len(template)
    requests = [agent_request(0, template, int((now - 1) * 1e9), rnd, totals) for _ in range(50)]
    waits: list[float] = []
    done = threading.Event()

    def push(target: WindowStore) -> None:
        while not done.is_set():
            for request in requests:
                started = time.perf_counter()
                target.ingest(request)
                waits.append(time.perf_counter() - started)

    pusher = threading.Thread(target=push, args=(store,))
    with tempfile.TemporaryDirectory(dir=".") as folder:
        path = Path(folder) / "window.npz"
        pusher.start()
        stats = store.write_snapshot(path)
        done.set()
        pusher.join()
        memory = store.memory_bytes()
        push_minutes(store, clock, args.agents, args.changes_minutes)
        changes = store.write_snapshot(path, changes_only=True)
        assert changes.changes_only
        del store
        fresh = WindowStore(step_seconds=STEP_S, clock=clock, max_series=2_000_000)
        started = time.perf_counter()
        restored = fresh.read_snapshot(path)
        read_seconds = time.perf_counter() - started
    assert restored is not None
    print(f"store: {args.agents * GPUS} GPUs, {stats.series} series, up {hours:g} h")
    print(f"store memory (memory_bytes): {memory / 2**20:,.0f} MiB")
    print(f"full snapshot: {stats.size_bytes / 2**20:,.1f} MiB")
    print(f"full write (temp + fsync + rename): {stats.write_seconds:.2f} s")
    print(
        f"one agent's 320-point request during the full write: {len(waits)} requests, "
        f"p50 {np.percentile(waits, 50) * 1e3:.1f} ms, max {max(waits) * 1e3:.0f} ms"
    )
    print(
        f"at shutdown, the changes of {args.changes_minutes:g} min since the full one: "
        f"{changes.size_bytes / 2**20:,.1f} MiB in {changes.write_seconds:.2f} s"
    )
    print(
        f"read full + changes into an empty store: {read_seconds:.2f} s ({restored.series} series)"
    )


if __name__ == "__main__":
    main()
