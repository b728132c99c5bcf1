"""One order, one job, one transaction: both are written, or neither."""

import json

from asgiref.sync import sync_to_async
from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from shop.jobs import confirm_order
from shop.models import Order


def place(email: str, fail: bool) -> dict[str, object]:
    with transaction.atomic():
        order = Order.objects.create(email=email)
        result = confirm_order.enqueue(order.id, job_id=f"confirm-{order.id}")
        if fail:  # a later step of the business change fails: the job goes with the order
            raise RuntimeError("payment declined")
    return {"order_id": order.id, "job_id": result.job_id}


@csrf_exempt
def place_order(request: HttpRequest) -> JsonResponse:
    data = json.loads(request.body or b"{}")
    try:
        return JsonResponse(place(data["email"], bool(data.get("fail"))), status=202)
    except RuntimeError as exc:
        return JsonResponse({"error": str(exc)}, status=402)


@csrf_exempt
async def place_order_async(request: HttpRequest) -> JsonResponse:
    """An async view: the transaction and the enqueue run together on Django's sync thread."""
    data = json.loads(request.body or b"{}")
    try:
        placed = await sync_to_async(place, thread_sensitive=True)(
            data["email"], bool(data.get("fail")))
    except RuntimeError as exc:
        return JsonResponse({"error": str(exc)}, status=402)
    return JsonResponse(placed, status=202)


def order_status(request: HttpRequest, order_id: int) -> JsonResponse:
    order = Order.objects.filter(id=order_id).first()
    if order is None:
        return JsonResponse({"error": "no such order"}, status=404)
    job = confirm_order.app.queue("orders").get(f"confirm-{order.id}")
    return JsonResponse({"order_id": order.id, "confirmed": order.confirmed,
                         "job_status": job.status if job else None})
