"""A small TCP proxy on 127.0.0.1 for fault tests: put it between a daemon and NATS, then cut or stall the line.

- ``cut(seconds)``: close every connection at once and refuse new ones for a while (a partition, a dead link);
- ``stall(seconds)``: keep the connections open but move no byte either way for a while (a hung network: nothing
  fails, everything waits), then deliver what was held.
"""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._refusing = False
        self.port = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self._close_all()
        for link in list(self._links):
            link.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)

    async def cut(self, seconds: float) -> None:
        self._refusing = True
        self._close_all()
        try:
            await asyncio.sleep(seconds)  # the length of the partition is the fault
        finally:
            self._refusing = False

    async def stall(self, seconds: float) -> None:
        self._flowing.clear()
        try:
            await asyncio.sleep(seconds)  # the length of the stall is the fault
        finally:
            self._flowing.set()

    def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            client_writer.close()
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(*self._target)
        except OSError:
            client_writer.close()
            return
        self._writers.update((client_writer, server_writer))
        pumps = [
            asyncio.ensure_future(self._pump(client_reader, server_writer)),
            asyncio.ensure_future(self._pump(server_reader, client_writer)),
        ]
        link = asyncio.ensure_future(asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED))
        self._links.add(link)  # type: ignore[arg-type]
        try:
            await link
        finally:
            self._links.discard(link)  # type: ignore[arg-type]
            for pump in pumps:
                pump.cancel()
            for writer in (client_writer, server_writer):
                writer.close()
                self._writers.discard(writer)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
