"""The fenced-out signal, in one place for every resource a fencing token guards.

A stale token meeting a fence is the system working: a holder that lost its lock was stopped
before it wrote. `fenced_out()` therefore logs at WARNING (an operator looks at a burst, nobody
is paged for one; an ERROR line means dlock itself misbehaved), counts
`lock_fenced_out_total{resource}` and builds the 409 FENCED_OUT error with both tokens. The
fenced SQL only reports that its conditional write matched no row; the service calls this and
raises what it returns.
"""

from __future__ import annotations

import logging
from typing import Any

from dlock.errors import ApiError, Code
from dlock.logs import log_event
from dlock.metrics import FENCED_RESOURCES, lock_fenced_out

LOG_LEVEL = logging.WARNING
DEFAULT_MESSAGE = "a newer fencing token has written this resource; abort the critical section"


def fenced_out(
    *,
    resource: str,
    resource_id: str,
    presented: int,
    highest: int,
    owner_id: str,
    message: str = DEFAULT_MESSAGE,
    **log_fields: Any,
) -> ApiError:
    """Emit `fenced_out` and lock_fenced_out_total once; return the FENCED_OUT error to raise.

    `log_fields` are extra keys of the log line only (e.g. the rail's payoutId and reason); the
    envelope's details are always the five C3 names.
    """
    if resource not in FENCED_RESOURCES:
        raise ValueError(f"unknown fenced resource {resource!r}")
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
    return ApiError(
        Code.FENCED_OUT,
        message,
        details={
            "presentedToken": presented,
            "highestToken": highest,
            "resourceType": resource,
            "resourceId": resource_id,
            "ownerId": owner_id,
        },
    )
