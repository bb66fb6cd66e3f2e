"""The stock service: take one item of a SKU, fenced on the lock `stock:{sku}`.

Everything dlock-specific is two names from the fence kit: `fenced_view` checks the caller's
X-Fencing-Token / X-Fencing-Proof against the lock key and hands the view the token;
`fenced_update` writes the row only if that token is the newest it has seen, else raises
FencedOut, which the decorator answers as 409 FENCED_OUT (C3 envelope).
"""

from __future__ import annotations

from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from psycopg import sql

from dlock.fence import fenced_update
from dlock.fence.django import fenced_view

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS stock (
    sku          text PRIMARY KEY,
    quantity     integer NOT NULL,
    fence        bigint NOT NULL DEFAULT 0,  -- the newest fencing token that wrote the row
    last_writer  text
)
"""


@fenced_view(key=lambda request, sku: f"stock:{sku}")
def take(request: HttpRequest, sku: str, *, fencing_token: int) -> HttpResponse:
    owner = request.headers.get("X-Owner-Id", "anonymous")
    with transaction.atomic(), connection.cursor() as cursor:
        (quantity,) = fenced_update(
            cursor,
            table="stock",
            where={"sku": sku},
            set={"quantity": sql.SQL("quantity - 1"), "last_writer": owner},
            token=fencing_token,
            owner_id=owner,
            resource_type="stock",
            resource_id=sku,
            returning=("quantity",),
        )
    return JsonResponse({"sku": sku, "quantity": quantity, "fence": fencing_token})


def show(request: HttpRequest, sku: str) -> HttpResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT quantity, fence, last_writer FROM stock WHERE sku = %s", [sku])
        row = cursor.fetchone()
    if row is None:
        return JsonResponse({"sku": sku, "found": False}, status=404)
    return JsonResponse({"sku": sku, "quantity": row[0], "fence": row[1], "lastWriter": row[2]})


def view(request: HttpRequest, sku: str) -> HttpResponse:
    return take(request, sku) if request.method == "POST" else show(request, sku)


def health(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"status": "UP"})


urlpatterns = [
    path("health/ready", health),
    path("stock/<str:sku>", view),
]
