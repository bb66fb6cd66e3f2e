"""The operator audit, in one place: what a resolution, a rail recovery, a reversal (all three
through payments/operator_action.py) and the ops commands leave behind when an operator acts or
is refused.

  * done: a Django LogEntry on each object the step touched (their admin History pages show
    it), in the step's own transaction, and one JSON log event after its commit;
  * refused: an `operator_refusal` row (whoever asked, an unknown `--operator` included), a
    LogEntry on the object when the operator is a known staff user, and a WARNING JSON event,
    in a transaction of their own (the refused step wrote nothing).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import transaction

from dlock.dbrouter import alias_for
from dlock.logs import log_event
from payments.models import OperatorRefusal

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser
    from django.db.models import Model


def log_entry(
    *,
    user: AbstractBaseUser,
    model: type[Model],
    object_id: str,
    text: str,
    object_repr: str | None = None,
    flag: int = CHANGE,
    alias: str | None = None,
) -> None:
    """One admin History row on `model`/`object_id`, in the caller's transaction."""
    alias = alias or alias_for("payments")
    LogEntry.objects.using(alias).create(
        user_id=user.pk,
        content_type=ContentType.objects.db_manager(alias).get_for_model(model),
        object_id=str(object_id)[:200],
        object_repr=(object_repr or str(object_id))[:200],
        action_flag=flag,
        change_message=text[:2000],
    )


def done(event: str, *, level: int = logging.INFO, alias: str | None = None, **fields: Any) -> None:
    """The step's JSON event, logged once its transaction commits."""
    transaction.on_commit(
        lambda: log_event(event, level=level, **fields), using=alias or alias_for("payments")
    )


def refused(
    event: str,
    *,
    operator: str,
    user: AbstractBaseUser | None,
    action: str,
    reason: str,
    model: type[Model] | None = None,
    object_type: str,
    object_id: str | None,
    note: str = "",
    **fields: Any,
) -> None:
    """Record a refusal (module docstring); `user` None for an operator paydb does not know."""
    log_event(
        event,
        level=logging.WARNING,
        operator=operator,
        action=action,
        reason=reason,
        note=note,
        **fields,
    )
    alias = alias_for("payments")
    with transaction.atomic(using=alias):
        OperatorRefusal.objects.using(alias).create(
            operator=operator[:150],
            known_user=user is not None,
            action=action[:64],
            object_type=object_type[:32],
            object_id=(object_id or "-")[:200],
            reason=reason,
            note=note or "",
        )
        if user is not None and model is not None:
            log_entry(
                user=user,
                model=model,
                object_id=object_id or "-",
                text=f"refused: {action}: {reason}",
                alias=alias,
            )
