"""A TCP forwarder for tests: a pooler or proxy between a client and its server, or, with its
``hole`` set, a black-holed network between them."""

from __future__ import annotations

import socket
import threading


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
