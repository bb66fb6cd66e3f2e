"""lockdb tables of the PostgreSQL lock backend. Read and written only by raw SQL in
`lockserver/backends/pg_sql/` (every expiry is decided by `clock_timestamp()` there); the models
exist for migrations, the admin-free ops shell and tests.
"""

from __future__ import annotations

from django.db import models


class LockSession(models.Model):
    """L1 session. Expired rows are kept LOCK_SESSION_RETENTION_MS so L2 can say 410, not 404."""

    session_id = models.UUIDField(primary_key=True)
    owner_id = models.CharField(max_length=64)
    ttl_ms = models.IntegerField()
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    last_heartbeat_at = models.DateTimeField()
    # The reaper logged `session_expired` for it (each expiry is logged once).
    expiry_logged = models.BooleanField(default=False)

    class Meta:
        db_table = "lock_session"
        indexes = [
            models.Index(
                fields=["expires_at"],
                name="lock_session_unlogged_exp",
                condition=models.Q(expiry_logged=False),
            ),
            models.Index(fields=["expires_at"], name="lock_session_expires"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(ttl_ms__gte=1_000, ttl_ms__lte=60_000),
                name="lock_session_ttl_range",
            )
        ]

    def __str__(self) -> str:
        return f"session {self.session_id} of {self.owner_id}"


class LockGrant(models.Model):
    """One row per key ever acquired: the L7 "seen" record AND the key's single grant.

    The holder columns are NULL when the key is free; a grant is live while
    `expires_at` and `session_expires_at` (the holder session's expiry, refreshed by heartbeat)
    are both in the future by the database clock. The primary key makes two grants for one key
    unrepresentable; keeping the row after release means a token is always drawn under the key's
    row lock, so tokens of one key increase in grant order.
    """

    lock_key = models.CharField(max_length=128, primary_key=True)
    first_seen_at = models.DateTimeField()
    session_id = models.UUIDField(null=True)
    owner_id = models.CharField(max_length=64, null=True)  # noqa: DJ001 - NULL = free
    fencing_token = models.BigIntegerField(null=True, unique=True)
    ttl_ms = models.IntegerField(null=True)
    acquired_at = models.DateTimeField(null=True)
    expires_at = models.DateTimeField(null=True)
    session_expires_at = models.DateTimeField(null=True)
    # The grant this one replaced after it lapsed (for the `lock_expired` event).
    previous_token = models.BigIntegerField(null=True)
    previous_owner_id = models.CharField(max_length=64, null=True)  # noqa: DJ001  # noqa: DJ001 - NULL = free
    # Until when some waiter may be parked on this key (set by every waiter as it parks, never
    # lowered): a release, revoke, session close or reap NOTIFYs the key only before this time.
    waiter_until = models.DateTimeField(null=True)

    class Meta:
        db_table = "lock_grant"
        indexes = [
            models.Index(fields=["session_id"], name="lock_grant_session"),
            models.Index(
                fields=["expires_at"],
                name="lock_grant_held_expires",
                condition=models.Q(fencing_token__isnull=False),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(fencing_token__isnull=True) | models.Q(fencing_token__gt=0),
                name="lock_grant_token_positive",
            ),
            models.CheckConstraint(
                condition=(
                    models.Q(
                        fencing_token__isnull=True,
                        session_id__isnull=True,
                        owner_id__isnull=True,
                        expires_at__isnull=True,
                        session_expires_at__isnull=True,
                    )
                    | models.Q(
                        fencing_token__isnull=False,
                        session_id__isnull=False,
                        owner_id__isnull=False,
                        expires_at__isnull=False,
                        session_expires_at__isnull=False,
                    )
                ),
                name="lock_grant_holder_all_or_none",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.lock_key} token={self.fencing_token}"


class LockWaiter(models.Model):
    """A caller blocked in L4 with waitMillis: counted for waiterCount and the per-key cap."""

    waiter_id = models.UUIDField(primary_key=True)
    lock_key = models.CharField(max_length=128)
    session_id = models.UUIDField()
    owner_id = models.CharField(max_length=64)
    since = models.DateTimeField()
    expires_at = models.DateTimeField()  # the wait deadline; a crashed waiter stops counting
    # Arrival order (ARCHITECTURE decision 23): drawn from lock_waiter_position_seq on insert.
    position = models.BigIntegerField(null=True)
    ttl_ms = models.IntegerField(null=True)  # the grant's ttlMillis if the lock is handed over

    class Meta:
        db_table = "lock_waiter"
        indexes = [
            models.Index(fields=["lock_key", "expires_at"], name="lock_waiter_key"),
            models.Index(fields=["lock_key", "position"], name="lock_waiter_queue"),
        ]

    def __str__(self) -> str:
        return f"waiter on {self.lock_key}"


class LockRevocation(models.Model):
    """L8 audit row, written in the revoking transaction."""

    revocation_id = models.UUIDField(primary_key=True)
    lock_key = models.CharField(max_length=128)
    operator = models.CharField(max_length=128)
    reason = models.TextField()
    revoked_token = models.BigIntegerField()
    revoked_owner_id = models.CharField(max_length=64)
    revoked_session_id = models.UUIDField()
    new_token_floor = models.BigIntegerField()
    revoked_at = models.DateTimeField()

    class Meta:
        db_table = "lock_revocation"
        indexes = [models.Index(fields=["lock_key", "revoked_at"], name="lock_revocation_key")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(new_token_floor__gt=models.F("revoked_token")),
                name="lock_revocation_floor_above_token",
            )
        ]

    def __str__(self) -> str:
        return f"revocation of {self.lock_key} token={self.revoked_token}"


class LockTokenHighWater(models.Model):
    """The highest token this deployment may have issued, whatever the backend (one row, id 1).

    Raised with GREATEST, never lowered: on pg it mirrors `fencing_token_seq`; on etcd it is a
    reserved ceiling written before any token above it is handed out. Every start-up, on either
    backend, puts the next token above it (docs/lockserver.md "Token continuity").
    """

    id = models.PositiveSmallIntegerField(primary_key=True)
    token = models.BigIntegerField()
    backend = models.CharField(max_length=8)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "lock_token_high_water"
        constraints = [
            models.CheckConstraint(condition=models.Q(id=1), name="lock_token_high_water_one_row"),
            models.CheckConstraint(
                condition=models.Q(token__gte=0), name="lock_token_high_water_non_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"token high water {self.token} ({self.backend})"
