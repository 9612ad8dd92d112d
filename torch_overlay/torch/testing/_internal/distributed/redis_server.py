"""A real Redis server for Inductor's remote caches, and a proxy that makes it fail.

:class:`RedisServer` runs Debian's ``redis-server`` on a free loopback port,
without persistence, for as long as a test needs it; Inductor's Redis
backend reaches it through ``TORCHINDUCTOR_REDIS_HOST`` and ``_PORT``
(:meth:`RedisServer.env`).  :class:`FaultyProxy` stands between some ranks
and the server and misbehaves on the first ``GET`` it forwards, as a remote
cache does on a real cluster:

* ``delay``: holds every request for some seconds from the first one on (a
  slow or far server, a large entry), then forwards it: redis-py gives up
  on an answer after 5 s and asks again on a new connection, which is held
  too;
* ``die``: forwards half of the server's reply, then kills the server
  (SIGKILL) and closes the connection: a server that stops halfway through
  an answer and is gone for the rest of the job (redis-py asks again after
  a connection error; every later request is refused).

:func:`missing` says what a test needs and does not have, for its skip
message.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import signal
import socket
import subprocess
import threading
import time
from typing import Any

from typing_extensions import Self


# Inductor's remote caches: compiled programs, and AOTAutograd's entries.
_REMOTE_CACHES = (
    "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE",
    "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE",
)

# How redis-py sends a GET: an array of two bulk strings, the command first.
_GET = b"*2\r\n$3\r\nGET\r\n"
_CHUNK = 1 << 16


def missing() -> str | None:
    """What a test of the remote caches lacks on this machine, or None."""
    lacking = []
    if shutil.which("redis-server") is None:
        lacking.append("redis-server (Debian: apt-get install redis-server)")
    if importlib.util.find_spec("redis") is None:
        lacking.append("the redis client (pip install redis)")
    return " and ".join(lacking) or None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """``redis-server`` on a loopback port of its own; started, flushed, killed and stopped by the test."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        """Start the server and wait until it answers (10 s at most)."""
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.client().ping():
                    return self
            except Exception:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
            time.sleep(0.05)

    def client(self) -> Any:
        """A ``redis.Redis`` client of the server."""
        # Imported here: the module exists only where the tests can run.
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10)

    def env(self, remote: bool = True, port: int | None = None) -> dict[str, str]:
        """The variables of a node that uses Inductor's remote caches on this server (or not).

        ``remote``: both remote caches on (``"1"``) or off (``"0"``: a node
        without the variable, or whose lookups fail); ``port``: a proxy's,
        in front of this server.
        """
        return {
            **dict.fromkeys(_REMOTE_CACHES, "1" if remote else "0"),
            "TORCHINDUCTOR_REDIS_HOST": "127.0.0.1",
            "TORCHINDUCTOR_REDIS_PORT": str(port or self.port),
        }

    def kill(self) -> None:
        """Kill the server at once, as a crash does (idempotent)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        """Kill the server and forget it."""
        self.kill()
        self.process = None


class FaultyProxy:
    """A loopback TCP proxy in front of ``server`` that misbehaves on the first GET it forwards.

    ``mode`` is ``"delay"`` (hold it and every GET after it until ``seconds``
    after it, then forward them),
    or ``"die"`` (forward half of the first part of its reply, then kill the
    server and close).  Every other request passes.
    ``faults`` counts the faults injected; a context manager stops it.
    """

    def __init__(self, server: RedisServer, mode: str, seconds: float = 0.0) -> None:
        if mode not in ("delay", "die"):
            raise ValueError(f"unknown mode {mode!r}")
        self.server, self.mode, self.seconds = server, mode, seconds
        self.faults = 0
        self._held_until = 0.0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop proxying: close the listener and every connection."""
        self._stopped.set()
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _first_get(self) -> bool:
        with self._lock:
            if self.faults:
                return False
            self.faults = 1
            self._held_until = time.monotonic() + self.seconds
            return True

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.server.port))
            except OSError:  # the server is gone: refuse, as it would
                client.close()
                continue
            self._sockets += [client, upstream]
            dies_in_reply = threading.Event()
            threading.Thread(
                target=self._requests,
                args=(client, upstream, dies_in_reply),
                daemon=True,
            ).start()
            threading.Thread(
                target=self._replies,
                args=(upstream, client, dies_in_reply),
                daemon=True,
            ).start()

    def _requests(
        self, client: socket.socket, upstream: socket.socket, dies: threading.Event
    ) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(_CHUNK):
                first = data.startswith(_GET) and self._first_get()
                if self.mode == "delay" and data.startswith(_GET):
                    time.sleep(max(self._held_until - time.monotonic(), 0.0))
                elif first:
                    dies.set()
                upstream.sendall(data)
        for sock in (client, upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _replies(
        self, upstream: socket.socket, client: socket.socket, dies: threading.Event
    ) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(_CHUNK):
                if dies.is_set():
                    client.sendall(data[: len(data) // 2])
                    self.server.kill()
                    break
                client.sendall(data)
        for sock in (client, upstream):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
