"""A TCP proxy to PostgreSQL that can fall silent: every connection stays open, nothing is forwarded.

Frozen, it behaves like a SIGSTOPped server (TCP up, no answer). It freezes
when told (`freeze()`), or by itself once the client sends a simple query
naming `freeze_on` (e.g. b"COMMIT"), so a test can silence the database at one
exact statement. Closes propagate both ways, as a real proxy's do, so a
connection the client gave up on does not keep a server transaction open.
"""

from __future__ import annotations

import socket
import threading


class FreezingProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.freeze_on: bytes | None = None
        self._open = threading.Event()  # set while bytes flow; a pump waits on it, so a thaw wakes it at once
        self._open.set()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        try:
            while data := source.recv(65536):
                if from_client and self.freeze_on is not None and b"Q" in data and self.freeze_on in data:
                    self.freeze()
                self._open.wait()  # hold the bytes: the peer waits, as on a stopped server
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (sink, source):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    @property
    def frozen(self) -> bool:
        return not self._open.is_set()

    def freeze(self) -> None:
        self._open.clear()

    def thaw(self) -> None:
        self.freeze_on = None
        self._open.set()

    def close(self) -> None:
        self.thaw()
        self.listener.close()
        for sock in self.sockets:
            sock.close()
