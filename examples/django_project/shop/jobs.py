"""The shop's leaseq App: its store is Django's own connection (``django://default``)."""

import leaseq

app = leaseq.App(url="django://default")


@app.task(queue="orders")
def confirm_order(order_id: int) -> dict[str, int]:
    """Runs in ``manage.py leaseq_worker``: uses the ORM like any Django code."""
    from shop.models import Order

    updated = Order.objects.filter(id=order_id).update(confirmed=True)
    return {"confirmed": updated}
