"""A hostile gRPC client over raw HTTP/2 (the `h2` package on a plain loopback socket): it
opens a Verify stream with a receive window of 0, so the server can send it no answer, and
writes blocks as fast as the server's flow-control window lets it."""

from __future__ import annotations

import select
import socket
import struct
import time

import h2.config
import h2.connection
import h2.events
import h2.settings


def grpc_frame(message: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(message)) + message


def verify_headers(port: int, token: str | None) -> list[tuple[str, str]]:
    """The request headers of a Verify stream, with a bearer token when given."""
    headers = [
        (":method", "POST"), (":scheme", "http"), (":path", "/jaxspec.v1.Verifier/Verify"),
        (":authority", f"127.0.0.1:{port}"), ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]  # fmt: skip
    if token is not None:
        headers.append(("authorization", f"Bearer {token}"))
    return headers


def closed_window_stream(
    port: int, token: str | None
) -> tuple[socket.socket, h2.connection.H2Connection, int]:
    """A connection to 127.0.0.1:`port` whose receive window is 0 and one Verify stream on it
    (HEADERS queued, not yet sent): the server can write it no answer."""
    sock = socket.create_connection(("127.0.0.1", port))
    config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    conn = h2.connection.H2Connection(config)
    conn.local_settings = h2.settings.Settings(
        client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0}
    )
    conn.initiate_connection()
    stream = conn.get_next_available_stream_id()
    conn.send_headers(stream, verify_headers(port, token))
    return sock, conn, stream


class NonReadingClient:
    """One Verify stream to 127.0.0.1:`port` that never reads (stream window 0)."""

    def __init__(self, port: int, token: str | None):
        self.sock, self.conn, self.stream = closed_window_stream(port, token)
        self.sock.sendall(self.conn.data_to_send())
        self.sent = 0  # bytes of DATA the server's window let through
        self.events: list[h2.events.Event] = []

    def _pump(self, wait_s: float) -> None:
        if select.select([self.sock], [], [], wait_s)[0]:
            data = self.sock.recv(1 << 16)
            if data:
                self.events += self.conn.receive_data(data)  # never a WINDOW_UPDATE of ours
        out = self.conn.data_to_send()
        if out:
            self.sock.sendall(out)

    def push(self, first: bytes, then: bytes, *, cap: int, stall_s: float) -> int:
        """Send `first`, then `then` again and again (each a gRPC message), as the window
        allows, until `cap` bytes went out or nothing could be sent for `stall_s`: the bytes
        sent."""
        pending, last = grpc_frame(first), time.monotonic()
        while self.sent < cap and time.monotonic() - last < stall_s:
            self._pump(0.02)
            while True:
                if not pending:
                    pending = grpc_frame(then)
                window = self.conn.local_flow_control_window(self.stream)
                n = min(window, self.conn.max_outbound_frame_size, len(pending))
                if n <= 0 or self.sent >= cap:
                    break
                self.conn.send_data(self.stream, pending[:n])
                pending, self.sent, last = pending[n:], self.sent + n, time.monotonic()
            out = self.conn.data_to_send()
            if out:
                self.sock.sendall(out)
        return self.sent

    def close(self) -> None:
        self.sock.close()


def rapid_resets(port: int, token: str | None, n: int) -> None:
    """`n` Verify streams on one connection, each HEADERS then RST_STREAM at once (the
    "rapid reset" pattern), then the connection closes."""
    import h2.errors

    sock = socket.create_connection(("127.0.0.1", port))
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    )
    conn.initiate_connection()
    headers = verify_headers(port, token)
    try:
        for _ in range(n):
            stream = conn.get_next_available_stream_id()
            conn.send_headers(stream, headers)
            conn.reset_stream(stream, h2.errors.ErrorCodes.CANCEL)
            sock.sendall(conn.data_to_send())
        while select.select([sock], [], [], 1.0)[0] and sock.recv(1 << 16):
            pass  # what the server answers, until it has nothing more to say for a second
    finally:
        sock.close()
