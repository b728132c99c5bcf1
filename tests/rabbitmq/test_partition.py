"""A consumer cut off from RabbitMQ but not from its store (issue 14): its connection goes
through a proxy the test turns into a black hole (bytes swallowed both ways, nothing closed or
reset), while its jobs run and their results are written. No job is lost and no delivery is
acked before its result: RabbitMQ, hearing nothing, returns the unacked deliveries; another
consumer's claim finds those jobs done and acks them without a second effect; the cut-off
consumer notices within its heartbeat bound and reconnects by itself once the link is back.
(The reverse partition, from the store, is the executor's lease clock: tests/worker.)"""

from __future__ import annotations

import socket
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import pytest
from rabbit_harness import Harness, wait_for
from test_delivery import all_done, enqueue

pytestmark = pytest.mark.rabbitmq

#: The cut-off consumer's AMQP heartbeat: it and RabbitMQ notice the silence within two.
HEARTBEAT_S = 2


class BlackHoleProxy:
    """Forwards TCP connections to ``target``; while ``hole`` is set every byte either way is
    read and dropped, so both ends just stop hearing from each other."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.hole = threading.Event()
        self.accepted = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            try:
                server = socket.create_connection(self.target, 5)
            except OSError:
                client.close()
                continue
            self._sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if not self.hole.is_set():
                    dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._listener.close()
        for sock in self._sockets:
            sock.close()


def _through(proxy: BlackHoleProxy, amqp_url: str) -> str:
    parts = urlsplit(amqp_url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{proxy.port}"
    netloc_new = f"{netloc[0]}@{host}" if len(netloc) == 2 else host
    return urlunsplit((parts.scheme, netloc_new, parts.path, f"heartbeat={HEARTBEAT_S}", ""))


def test_a_consumer_black_holed_from_the_broker_loses_no_job_and_never_acks_early(
        harness: Harness) -> None:
    parts = urlsplit(harness.amqp_url)
    proxy = BlackHoleProxy((parts.hostname or "127.0.0.1", parts.port or 5672))
    try:
        # Given jobs, a dispatcher, and consumer A whose only way to RabbitMQ is the proxy
        ids = enqueue(harness, 40, sleep_s=0.3)
        direct_url = harness.amqp_url
        harness.amqp_url = _through(proxy, direct_url)
        harness.start("consume", "--concurrency", "4")
        harness.amqp_url = direct_url
        harness.start("dispatch")
        queue = harness.queue()
        wait_for("A at work", lambda: queue.counts().get("done", 0) >= 4, 30, harness)
        # When A's link to RabbitMQ goes silent (its store still answers) while B joins
        proxy.hole.set()
        cut_at, before = time.monotonic(), proxy.accepted
        harness.start("consume", "--concurrency", "4")
        wait_for("every job done while A is cut off", lambda: all_done(harness, 40), 60,
                 harness)
        time.sleep(max(cut_at + 4 * HEARTBEAT_S - time.monotonic(), 0))  # past detection
        proxy.hole.clear()
        # Then A reconnects by itself once the link is back
        wait_for("A reconnected", lambda: proxy.accepted > before, 6 * HEARTBEAT_S + 20,
                 harness)
        harness.stop_all()
        # And no job was lost, each made its effect once, and no delivery was acked before
        # its job's result was saved
        assert queue.counts() == {"done": 40}
        effects = harness.effects()
        assert set(effects) == set(ids) and max(effects.values()) == 1
        redelivered = 0
        for job_id in ids:
            journal = queue.journal(job_id)
            names = [e.event for e in journal]
            assert "result_saved" in names, names
            if "ack_sent" in names:
                assert names.index("result_saved") < names.index("ack_sent"), names
            redelivered += any(e.event == "received" and e.data["redelivered"] for e in journal)
        # And A's unacked deliveries did come back (their acks were cut off)
        assert redelivered >= 1
    finally:
        proxy.close()
