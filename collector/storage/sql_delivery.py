"""Delivery's records in SQL: notifications, pages, the dispatcher's cursors, and the agent
rounds already stored (the receiving side of delivery)."""

from __future__ import annotations

from gpuwarden.collector.storage.base import (
    NotificationRecord,
    PageRecord,
    RoundsRecord,
    StorageError,
)
from gpuwarden.collector.storage.dialect import DIALECTS
from gpuwarden.collector.storage.records import (
    dump_json,
    load_json,
)
from gpuwarden.collector.storage.sql_base import SqlBase
from gpuwarden.collector.storage.sql_codec import Codec, field_names

_NOTIFICATIONS = Codec(
    "notifications",
    NotificationRecord,
    field_names(NotificationRecord),
    to_sql={"delivered": int},
    from_sql={"delivered": bool},
)
# The cluster is the last stamp of every insert: this store's own (``SqlBase.cluster``).
_SAVE_NOTIFICATION = {
    d: _NOTIFICATIONS.replace_sql(("cluster",), ("incident_id", "route"), d) for d in DIALECTS
}
_PAGES = Codec(
    "pages",
    PageRecord,
    field_names(PageRecord, without="page_id"),
    row_id="page_id",
    to_sql={"alert": dump_json},
    from_sql={"alert": load_json},
)
_ROUNDS = Codec("agent_rounds", RoundsRecord, field_names(RoundsRecord))
_SAVE_ROUNDS = _ROUNDS.insert_sql(
    suffix="ON CONFLICT (caller, instance) DO UPDATE SET (high_water, stored_below, updated_at)"
    " = (excluded.high_water, excluded.stored_below, excluded.updated_at)"
    " WHERE excluded.high_water >= agent_rounds.high_water"
)
_PAGE_MUTABLE = ("status", "attempts", "next_attempt_at", "sent_at", "last_error", "alert")


class DeliveryRecords(SqlBase):
    """The ``Storage`` methods of notifications, pages and cursors."""

    # Notifications ---------------------------------------------------------------------------

    def save_notification(self, record: NotificationRecord) -> None:
        with self._write() as conn:
            self._check_fence(conn)
            params = _NOTIFICATIONS.params(record, self.cluster)
            conn.execute(_SAVE_NOTIFICATION[self.dialect], params)

    def notifications(
        self,
        *,
        incident_id: int | None = None,
        status: str | None = None,
        delivered: bool | None = None,
    ) -> list[NotificationRecord]:
        sql = (
            "SELECT * FROM notifications WHERE cluster = ? AND (? IS NULL OR incident_id = ?)"
            " AND (? IS NULL OR status = ?) AND (? IS NULL OR delivered = ?)"
            " ORDER BY incident_id, route"
        )
        flag = None if delivered is None else int(delivered)
        params = (self.cluster, incident_id, incident_id, status, status, flag, flag)
        rows = self._read(sql, params)
        return [_NOTIFICATIONS.load(row) for row in rows]

    def add_page(self, record: PageRecord) -> int:
        if record.page_id is not None:
            raise ValueError("add_page takes a new page (page_id=None)")
        with self._write() as conn:
            params = _PAGES.params(record, self.cluster)
            page_id = self._insert(conn, _PAGES.insert_sql(("cluster",)), params, "page_id")
        if page_id is None:  # pragma: no cover - a successful INSERT always sets it
            raise StorageError("pages insert returned no id")
        return page_id

    def save_page(self, record: PageRecord) -> None:
        if record.page_id is None:
            raise ValueError("save_page takes a stored page")
        sets = ", ".join(f"{c} = ?" for c in _PAGE_MUTABLE)
        values = [
            dump_json(record.alert) if c == "alert" else getattr(record, c) for c in _PAGE_MUTABLE
        ]
        with self._write() as conn:
            self._check_fence(conn)
            conn.execute(
                f"UPDATE pages SET {sets} WHERE page_id = ? AND cluster = ?",  # noqa: S608 - column names are constants
                (*values, record.page_id, self.cluster),
            )

    def pages(self, *, status: str | None = None) -> list[PageRecord]:
        rows = self._read(
            "SELECT * FROM pages WHERE cluster = ? AND (? IS NULL OR status = ?) ORDER BY page_id",
            (self.cluster, status, status),
        )
        return [_PAGES.load(row) for row in rows]

    def cursor(self, name: str) -> int:
        rows = self._read(
            "SELECT position FROM cursors WHERE name = ? AND cluster = ?", (name, self.cluster)
        )
        return int(rows[0][0]) if rows else 0

    def set_cursor(self, name: str, position: int) -> None:
        with self._write() as conn:
            self._check_fence(conn)
            conn.execute(
                "INSERT INTO cursors (name, position, updated_at, cluster) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (cluster, name) DO UPDATE SET (position, updated_at)"
                " = (excluded.position, excluded.updated_at)",
                (name, position, self._clock(), self.cluster),
            )

    # Agent rounds ----------------------------------------------------------------------------

    def rounds_record(self, caller: str, instance: str) -> RoundsRecord | None:
        rows = self._read(
            "SELECT * FROM agent_rounds WHERE caller = ? AND instance = ?", (caller, instance)
        )
        return _ROUNDS.load(rows[0]) if rows else None

    def save_rounds_record(self, record: RoundsRecord) -> None:
        with self._write() as conn:
            conn.execute(_SAVE_ROUNDS, _ROUNDS.params(record))
