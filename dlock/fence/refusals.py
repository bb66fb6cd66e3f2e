"""The fence kit's refusals: FencedOut (409 FENCED_OUT) and the signal that comes with it.

A stale token meeting a fence is the system working: a holder that lost its lock was stopped
before it wrote. `fenced_out()` therefore logs the `fenced_out` event at WARNING (an operator
looks at a burst, nobody is paged for one; an ERROR line means dlock itself misbehaved), counts
`lock_fenced_out_total{resource}` and builds the FencedOut error with both tokens. A
conditional write only reports that it matched no row; its caller (the kit's `fenced_update`,
a payments service, rail-proxy's admission) calls this and raises what it returns.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from dlock.errors import ApiError, Code
from dlock.logs import log_event
from dlock.metrics import lock_fenced_out

LOG_LEVEL = logging.WARNING
DEFAULT_MESSAGE = "a newer fencing token has written this resource; abort the critical section"
# A resource type is a metric label and a log field: short, lower-case, fixed per call site.
_RESOURCE = re.compile(r"[a-z][a-z0-9_]{0,31}", re.ASCII)


class FencedOut(ApiError):
    """409 FENCED_OUT: a newer fencing token already wrote this resource; the presenter lost
    its lock and must abort its critical section (retrySafe false: retrying cannot help).

    The attributes are C3's details: presented_token, highest_token, resource_type,
    resource_id, owner_id.
    """

    def __init__(
        self,
        *,
        presented_token: int,
        highest_token: int,
        resource_type: str,
        resource_id: str,
        owner_id: str,
        message: str = DEFAULT_MESSAGE,
    ) -> None:
        super().__init__(
            Code.FENCED_OUT,
            message,
            details={
                "presentedToken": presented_token,
                "highestToken": highest_token,
                "resourceType": resource_type,
                "resourceId": resource_id,
                "ownerId": owner_id,
            },
        )
        self.presented_token = presented_token
        self.highest_token = highest_token
        self.resource_type = resource_type
        self.resource_id = resource_id
        self.owner_id = owner_id


def fenced_out(
    *,
    resource: str,
    resource_id: str,
    presented: int,
    highest: int,
    owner_id: str,
    message: str = DEFAULT_MESSAGE,
    **log_fields: Any,
) -> FencedOut:
    """Emit `fenced_out` and lock_fenced_out_total{resource} once; return the FencedOut to raise.

    `resource` is the resource type (`account`, `rail`, an adopter's `stock`); `log_fields` are
    extra keys of the log line only (e.g. the rail's payoutId and reason); the envelope's
    details are always the five C3 names.
    """
    if not _RESOURCE.fullmatch(resource):
        raise ValueError(f"resource type {resource!r} must be 1…32 of [a-z0-9_], a letter first")
    log_event(
        "fenced_out",
        level=LOG_LEVEL,
        resource=resource,
        resourceId=resource_id,
        presentedToken=presented,
        highestToken=highest,
        ownerId=owner_id,
        **log_fields,
    )
    lock_fenced_out.labels(resource=resource).inc()
    return FencedOut(
        presented_token=presented,
        highest_token=highest,
        resource_type=resource,
        resource_id=resource_id,
        owner_id=owner_id,
        message=message,
    )
