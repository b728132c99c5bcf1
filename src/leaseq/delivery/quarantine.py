"""Reading the quarantine queue: what was dead-lettered, and why (``x-death``)."""

from __future__ import annotations

from typing import Any

from leaseq.delivery.connection import decode, session
from leaseq.delivery.topology import Topology


def peek(amqp_url: str, topology: Topology, queue: str, limit: int = 20
         ) -> tuple[int, list[dict[str, Any]]]:
    """``(count, items)``: how many messages the quarantine queue holds and the first
    ``limit`` of them as ``{job_id, reason, from_queue, count}``. Messages stay in the queue
    (they are fetched unacked and the channel is closed, so RabbitMQ returns them)."""
    name = topology.quarantine_queue(queue)
    with session(amqp_url, "leaseq-quarantine") as conn:
        channel = conn.channel()
        count = channel.queue_declare(name, passive=True).method.message_count
        items = []
        for _ in range(min(limit, count)):
            method, props, body = channel.basic_get(name, auto_ack=False)
            if method is None or props is None or body is None:
                break  # pika gives all three or none
            items.append(describe(dict(props.headers or {}), body))
        channel.close()
    return count, items


def describe(headers: dict[str, Any], body: bytes) -> dict[str, Any]:
    decoded = decode(body)
    deaths = headers.get("x-death") or [{}]
    first = deaths[0]
    return {"job_id": decoded[1] if decoded else None, "reason": first.get("reason"),
            "from_queue": first.get("queue"), "count": first.get("count")}
