"""A minimal asyncio Redis (RESP2) client with a small connection pool: GET/SET/FLUSHALL/INFO/DBSIZE."""

from __future__ import annotations

import asyncio

__all__ = ["RedisError", "RedisPool"]

# The lab only needs a handful of commands; a client library would be one more dependency
# for what is a request/reply exchange over one socket.


class RedisError(RuntimeError):
    """A -ERR reply or a broken connection."""


def _encode(*args: str | bytes | int) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        raw = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


async def _read_reply(reader: asyncio.StreamReader):
    line = await reader.readline()
    if not line:
        raise RedisError("connection closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RedisError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = await reader.readexactly(n + 2)
        return data[:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [await _read_reply(reader) for _ in range(n)]
    raise RedisError(f"unexpected reply {line!r}")


class RedisPool:
    """Up to `size` connections to one server; a connection that failed is dropped, not reused."""

    def __init__(self, host: str, port: int, *, size: int = 8, timeout: float = 1.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._gate = asyncio.Semaphore(size)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def execute(self, *args: str | bytes | int):
        async with self._gate:
            conn = self._idle.pop() if self._idle else None
            try:
                if conn is None:
                    conn = await asyncio.wait_for(asyncio.open_connection(self.host, self.port), self.timeout)
                reader, writer = conn
                writer.write(_encode(*args))
                reply = await asyncio.wait_for(_read_reply(reader), self.timeout)
            except RedisError as exc:
                if "connection closed" in str(exc):
                    self._drop(conn)
                    raise
                self._idle.append(conn)  # an error reply leaves the connection usable
                raise
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
                self._drop(conn)
                raise RedisError(f"{self.address}: {exc!r}") from exc
            self._idle.append(conn)
            return reply

    @staticmethod
    def _drop(conn) -> None:
        if conn is not None:
            conn[1].close()

    async def get(self, key: str) -> bytes | None:
        return await self.execute("GET", key)

    async def set(self, key: str, value: bytes | str, ttl_s: int | None = None) -> None:
        if ttl_s:
            await self.execute("SET", key, value, "EX", ttl_s)
        else:
            await self.execute("SET", key, value)

    async def close(self) -> None:
        while self._idle:
            self._drop(self._idle.pop())
