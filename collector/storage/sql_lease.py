"""The leader lease of active/standby collectors, and the fence a leader's claims carry.

One row of ``leader_lease`` per lease name. :meth:`LeaseRecords.claim_lease` is one
transaction: it creates the row if missing, locks it, and then renews it (the caller holds it),
takes it over (it has expired: ``epoch`` + 1) or leaves it (someone else holds it), writing
"leader acquired / lost" entries to the audit log in the same transaction. Expiry is judged on
the database's clock (:meth:`~.dialect.Dialect.now_seconds`), so replicas' clocks never decide
who leads.

**Fencing.** A storage whose :attr:`LeaseRecords.fence` is set (the HA leader sets it to its
lease name, replica id and epoch) refuses a side-effecting claim (an action moving to
``executing``, a notification or page state, the audit mirror's cursor, accounting rows) unless
the lease row still names that holder and epoch and has not expired, checked in the *same*
transaction as the claim. On PostgreSQL the check reads the row ``FOR SHARE``: a takeover (an
``UPDATE`` of the row) waits until the claim commits, and a claim that comes after the takeover
sees the new epoch and is refused with :class:`FencedError`. So an old leader that was paused
(GC, SIGSTOP, a slow disk) and wakes up after a standby took over cannot commit a claim.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.collector.storage.records import AuditEntry
from gpuwarden.collector.storage.sql_base import Connection, Fence, FencedError
from gpuwarden.collector.storage.sql_remediation import RemediationRecords

__all__ = ["LEADER_ACTION", "Fence", "FencedError", "LeaseRecord", "LeaseRecords"]

LEADER_ACTION = "leader"
"""The audit log's ``action`` of the lease's entries (``verdict``: acquired, lost, released)."""


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """One lease row as read (times in the database's clock), with that clock's ``now``."""

    name: str
    holder: str
    epoch: int
    acquired_at: float
    renewed_at: float
    expires_at: float
    now: float

    @property
    def held(self) -> bool:
        """Whether someone holds the lease now (it has not expired and was ever taken)."""
        return self.epoch > 0 and self.expires_at > self.now


class LeaseRecords(RemediationRecords):
    """Lease rows and the fence check (the lease methods are not part of ``Storage``: only
    the HA election (``collector.ha``) uses them)."""

    def claim_lease(
        self, name: str, holder: str, lease_seconds: float, *, held_epoch: int | None
    ) -> LeaseRecord:
        """Renew (``held_epoch`` still current), take over (expired) or leave the lease.

        A caller named in the row without holding its epoch (its own lease lapsed locally, or
        it restarted under the same id) takes it over with a new epoch, as after an expiry.
        Returns the row after the attempt: ``holder`` is the caller's id when it leads.
        """
        now_sql = self.dialect.now_seconds
        with self._write() as conn:
            conn.execute(
                "INSERT INTO leader_lease (name, holder, epoch, acquired_at, renewed_at,"  # noqa: S608 - a constant
                f" expires_at) VALUES (?, '', 0, {now_sql}, {now_sql}, {now_sql})"
                " ON CONFLICT (name) DO NOTHING",
                (name,),
            )
            row = conn.execute(
                f"SELECT holder, epoch, acquired_at, renewed_at, expires_at, {now_sql}"  # noqa: S608 - a constant
                f" FROM leader_lease WHERE name = ?{self.dialect.lock_for_update}",
                (name,),
            ).fetchone()
            old_holder, epoch, acquired = str(row[0]), int(row[1]), float(row[2])
            expires, now = float(row[4]), float(row[5])
            until = now + lease_seconds
            if old_holder == holder and epoch == held_epoch and expires > now:
                conn.execute(
                    "UPDATE leader_lease SET renewed_at = ?, expires_at = ? WHERE name = ?",
                    (now, until, name),
                )
                return LeaseRecord(name, holder, epoch, acquired, now, until, now)
            if expires > now and epoch > 0 and old_holder != holder:  # someone else holds it
                return LeaseRecord(name, old_holder, epoch, acquired, float(row[3]), expires, now)
            conn.execute(
                "UPDATE leader_lease SET holder = ?, epoch = ?, acquired_at = ?, renewed_at = ?,"
                " expires_at = ? WHERE name = ?",
                (holder, epoch + 1, now, now, until, name),
            )
            if old_holder and expires > acquired:  # not released: it expired under its holder
                reason = f"leader lost by {old_holder} epoch {epoch}: lease not renewed in time"
                self._lease_audit(conn, now, holder, name, "lost", epoch, reason)
            reason = f"leader acquired by {holder} epoch {epoch + 1}"
            self._lease_audit(conn, now, holder, name, "acquired", epoch + 1, reason)
            return LeaseRecord(name, holder, epoch + 1, now, now, until, now)

    def release_lease(self, name: str, holder: str, epoch: int) -> bool:
        """Give the lease up now (a clean stop), so a standby takes over at once."""
        now_sql = self.dialect.now_seconds
        with self._write() as conn:
            row = conn.execute(
                f"SELECT {now_sql} FROM leader_lease WHERE name = ? AND holder = ?"  # noqa: S608 - a constant
                f" AND epoch = ? AND expires_at > {now_sql}{self.dialect.lock_for_update}",
                (name, holder, epoch),
            ).fetchone()
            if row is None:
                return False
            now = float(row[0])
            # expires_at = acquired_at marks a release (claim_lease then writes no "lost")
            conn.execute("UPDATE leader_lease SET expires_at = acquired_at WHERE name = ?", (name,))
            reason = f"leader released by {holder} epoch {epoch}"
            self._lease_audit(conn, now, holder, name, "released", epoch, reason)
            return True

    def fence_holds(self, fence: Fence) -> bool:
        """Whether ``fence``'s epoch is still the current, unexpired lease (a read): checked
        right before a call no transaction can cover (an actuator's, a notifier's), so that a
        deposed leader does not even start it."""
        rows = self._read(
            "SELECT 1 FROM leader_lease WHERE name = ? AND holder = ? AND epoch = ?"  # noqa: S608 - a constant
            f" AND expires_at > {self.dialect.now_seconds}",
            (fence.name, fence.holder, fence.epoch),
        )
        return bool(rows)

    def lease(self, name: str) -> LeaseRecord | None:
        """The lease row as it is now (``None``: never taken)."""
        rows = self._read(
            "SELECT name, holder, epoch, acquired_at, renewed_at, expires_at,"  # noqa: S608 - a constant
            f" {self.dialect.now_seconds} FROM leader_lease WHERE name = ?",
            (name,),
        )
        if not rows:
            return None
        r = rows[0]
        return LeaseRecord(
            str(r[0]), str(r[1]), int(r[2]), float(r[3]), float(r[4]), float(r[5]), float(r[6])
        )

    def _lease_audit(
        self,
        conn: Connection,
        now: float,
        actor: str,
        name: str,
        verdict: str,
        epoch: int,
        reason: str,
    ) -> None:
        entry = AuditEntry(
            time=now,
            actor=actor,
            action=LEADER_ACTION,
            target=name,
            reason=reason,
            verdict=verdict,
            dry_run=False,
            result=f"epoch {epoch}",
            inputs={"epoch": epoch},
        )
        self._append(conn, entry)
