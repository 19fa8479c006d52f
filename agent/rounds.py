"""The request headers that let a collector store each spooled round once.

Why headers and not OTLP resource attributes: a round's number changes every round, and a
resource attribute that changes every round would defeat what the collector keys on the
resource (its kept request shapes, its cache of announced workloads) and turn a steady agent's
cheap requests into full parses. The body therefore stays the standard OTLP request (several
spooled rounds concatenated, which protobuf merges into one ``ExportMetricsServiceRequest``),
and two headers say which rounds it holds and where each one ends:

* ``Gpuwarden-Agent-Instance``: the spool's identity, 32 lowercase hex digits
  (``Spool.instance_id``);
* ``Gpuwarden-Agent-Rounds``: one ``<seq>:<bytes>`` item per round, in body order, comma
  separated; ``<bytes>`` is the round's length in the uncompressed body and ``<seq>`` its spool
  sequence number, left out when it is the previous item's plus one (``1041:38211,:38190``).

A collector that ignores the headers still reads a valid request; one that honours them cuts the
body at the given lengths, stores each round it has not stored yet and acknowledges the others.
Standard library only: both the agent and the collector import this module, the one statement
of the format.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

INSTANCE_HEADER = "Gpuwarden-Agent-Instance"
ROUNDS_HEADER = "Gpuwarden-Agent-Rounds"
MAX_ROUNDS_HEADER_CHARS = 4096
"""Well under the 8 KiB a header line may have in common HTTP servers (aiohttp: 8190)."""
MAX_SEQ = (1 << 63) - 1
_INSTANCE = re.compile(r"[0-9a-f]{32}")
_ITEM = re.compile(r"([0-9]{0,19}):([0-9]{1,10})")


@dataclass(frozen=True, slots=True)
class Round:
    """One spooled round inside a request body: its sequence number and uncompressed length."""

    seq: int
    nbytes: int


def encode_rounds(rounds: Sequence[Round]) -> str:
    """The ``Gpuwarden-Agent-Rounds`` value of ``rounds`` (in body order)."""
    items = []
    previous = None
    for one in rounds:
        seq = "" if previous is not None and one.seq == previous + 1 else str(one.seq)
        items.append(f"{seq}:{one.nbytes}")
        previous = one.seq
    return ",".join(items)


def decode_rounds(value: str) -> tuple[Round, ...]:
    """Parse a ``Gpuwarden-Agent-Rounds`` value; raise ``ValueError`` saying what is wrong.

    Sequence numbers must rise strictly (the spool sends in order) and lie in ``1..MAX_SEQ``.
    """
    if len(value) > MAX_ROUNDS_HEADER_CHARS:
        raise ValueError(f"more than {MAX_ROUNDS_HEADER_CHARS} characters")
    out: list[Round] = []
    for item in value.split(","):
        match = _ITEM.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"item {item[:40]!r} is not <seq>:<bytes>")
        seq_text, nbytes = match.groups()
        if seq_text:
            seq = int(seq_text)
        elif out:
            seq = out[-1].seq + 1
        else:
            raise ValueError("the first item must name its sequence number")
        if not 1 <= seq <= MAX_SEQ:
            raise ValueError(f"sequence number {seq} out of range")
        if out and seq <= out[-1].seq:
            raise ValueError(f"sequence numbers must rise ({out[-1].seq} then {seq})")
        out.append(Round(seq, int(nbytes)))
    return tuple(out)


def valid_instance(value: str) -> bool:
    """Whether ``value`` is an instance id as the agent writes it."""
    return _INSTANCE.fullmatch(value) is not None
