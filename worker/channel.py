"""The host end of the payload protocol: one JSON object per line, read with deadlines.

The payload may write garbage, stall or die; the channel never blocks past a deadline and
never trusts a line it cannot parse. Every received message carries its arrival time
(``time.monotonic_ns()`` right after the read that completed the line), which is how Ready
is timestamped.
"""

from __future__ import annotations

import json
import os
import selectors
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

MAX_LINE_BYTES = 1 << 20  # a protocol line is small; anything longer is garbage
READ_CHUNK = 65536
STOP_POLL_S = 0.05  # how often a wait looks at the stop event (arrival times are exact anyway)


class ChannelError(Exception):
    """The payload's side of the protocol broke (internal to the runner, never escapes it)."""


class ChannelTimeout(ChannelError):
    """No complete line arrived before the deadline."""


class ChannelClosed(ChannelError):
    """The payload closed its output (exited or died)."""


class ChannelGarbage(ChannelError):
    """The payload wrote something that is not one JSON object per line."""


class ChannelStopped(ChannelError):
    """The caller asked to stop (Ctrl-C) while waiting."""


@dataclass(frozen=True)
class Message:
    """One protocol message and the host's monotonic arrival time in ns."""

    body: dict[str, Any]
    arrived_ns: int

    @property
    def op(self) -> str:
        """The message's ``op`` field ("" if absent)."""
        return str(self.body.get("op", ""))


class Channel:
    """Line-delimited JSON over a child's stdin and stdout pipes."""

    def __init__(
        self, to_child: IO[bytes], from_child: IO[bytes], stop: threading.Event | None = None
    ) -> None:
        self._out_fd = to_child.fileno()
        self._in_fd = from_child.fileno()
        os.set_blocking(self._in_fd, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._in_fd, selectors.EVENT_READ)
        self._buffer = bytearray()
        self._eof = False
        self._stop = stop
        self._last_read_ns = 0
        self._arrived_ns = 0

    def close(self) -> None:
        """Release the selector (the pipes belong to the process owner)."""
        self._selector.close()

    def send(self, body: dict[str, Any]) -> None:
        """Write one message; ChannelClosed if the payload no longer reads."""
        data = json.dumps(body, separators=(",", ":")).encode() + b"\n"
        try:
            written = os.write(self._out_fd, data)
        except (BrokenPipeError, OSError) as exc:
            raise ChannelClosed(f"payload stopped reading its input ({exc})") from exc
        if written != len(data):  # pipes write small messages atomically; be explicit anyway
            raise ChannelClosed("payload input pipe is full")

    def receive(self, deadline_ns: int) -> Message:
        """The next message, waiting until ``deadline_ns`` (monotonic) at most."""
        while True:
            line = self._take_line()
            if line is not None:
                return self._parse(line)
            if self._eof:
                raise ChannelClosed(self._eof_detail())
            self._fill(deadline_ns)

    def _take_line(self) -> bytes | None:
        """A complete line from the buffer, if there is one."""
        end = self._buffer.find(b"\n")
        if end < 0:
            if len(self._buffer) > MAX_LINE_BYTES:
                raise ChannelGarbage(f"line longer than {MAX_LINE_BYTES} bytes without a newline")
            return None
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        self._arrived_ns = self._last_read_ns
        return line

    def _fill(self, deadline_ns: int) -> None:
        """Block (in slices, watching the stop event) until data or EOF arrives."""
        while True:
            if self._stop is not None and self._stop.is_set():
                raise ChannelStopped("stopped by the caller")
            remaining = (deadline_ns - time.monotonic_ns()) / 1e9
            if remaining <= 0:
                raise ChannelTimeout("no complete line before the deadline")
            wait = min(remaining, STOP_POLL_S) if self._stop is not None else remaining
            if self._selector.select(wait):
                break
        try:
            chunk = os.read(self._in_fd, READ_CHUNK)
        except BlockingIOError:
            return
        self._last_read_ns = time.monotonic_ns()
        if not chunk:
            self._eof = True
        self._buffer += chunk

    def _parse(self, line: bytes) -> Message:
        """Decode one line; ChannelGarbage unless it is a JSON object with an ``op``."""
        try:
            body = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ChannelGarbage(f"not JSON: {line[:80]!r}") from exc
        if not isinstance(body, dict) or "op" not in body:
            raise ChannelGarbage(f"not a protocol message: {line[:80]!r}")
        return Message(body, self._arrived_ns)

    def _eof_detail(self) -> str:
        """Why the channel ended, with any partial line left behind."""
        if self._buffer:
            return f"payload output ended inside a line: {bytes(self._buffer[:80])!r}"
        return "payload output ended"
