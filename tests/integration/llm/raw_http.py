"""A keep-alive HTTP/1.1 server on a raw socket, for tests that must see (or send) exact bytes."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# `answer(head, body, conn)`: the request's head (request line and headers, as they arrived) and
# body; it answers on `conn` and says whether the connection stays open for the next request.
Answer = Callable[[bytes, bytes, socket.socket], bool]


@contextmanager
def raw_http_server(answer: Answer) -> Iterator[str]:
    """The server's base URL while it runs; each connection on a thread of its own, each request
    read by its `Content-Length` (none: no body) and handed to `answer`."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        buffer = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                body, buffer = buffer[:length], buffer[length:]
                if not answer(head, body, conn):
                    return

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
