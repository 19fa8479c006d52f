"""Operators' silences (the ``silences`` table of migration 6), for both SQL backends."""

from __future__ import annotations

from gpuwarden.collector.storage.base import SilenceRecord, StorageError
from gpuwarden.collector.storage.records import dump_json, load_json
from gpuwarden.collector.storage.sql_base import SqlBase
from gpuwarden.collector.storage.sql_codec import Codec, field_names

_SILENCES = Codec(
    "silences",
    SilenceRecord,
    field_names(SilenceRecord, without="silence_id"),
    row_id="silence_id",
    to_sql={"matchers": dump_json, "actions": int},
    from_sql={"matchers": load_json, "actions": bool},
)
_INSERT_SILENCE = _SILENCES.insert_sql(("cluster",))  # this store's own cluster


class SilenceRecords(SqlBase):
    """The ``Storage`` methods of silences."""

    def add_silence(self, record: SilenceRecord) -> int:
        if record.silence_id is not None:
            raise ValueError("add_silence takes a new silence (silence_id=None)")
        with self._write() as conn:
            params = _SILENCES.params(record, self.cluster)
            silence_id = self._insert(conn, _INSERT_SILENCE, params, "silence_id")
        if silence_id is None:  # pragma: no cover - a successful INSERT always sets it
            raise StorageError("silences insert returned no id")
        return silence_id

    def silence(self, silence_id: int) -> SilenceRecord | None:
        return self._one(_SILENCES, "SELECT * FROM silences WHERE silence_id = ?", silence_id)

    def silences(self, *, ending_after: float | None = None) -> list[SilenceRecord]:
        rows = self._read(
            "SELECT * FROM silences WHERE cluster = ? AND (? IS NULL OR ends_at > ?)"
            " ORDER BY silence_id",
            (self.cluster, ending_after, ending_after),
        )
        return [_SILENCES.load(row) for row in rows]

    def expire_silence(self, silence_id: int, *, now: float, actor: str) -> bool:
        # A silence that has not started yet ends before it starts: it never holds anything.
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE silences SET ends_at = CASE WHEN ? > starts_at + 0.001 THEN ?"
                " ELSE starts_at + 0.001 END, expired_by = ? WHERE silence_id = ? AND ends_at > ?"
                " AND cluster = ?",
                (now, now, actor, silence_id, now, self.cluster),
            )
            return cursor.rowcount > 0
