"""uvicorn, made quiet: its main loop wakes ten times a second only to check for shutdown."""

from __future__ import annotations

import asyncio
import socket
import threading

import uvicorn

TICK_SECONDS = 1.0


class QuietServer(uvicorn.Server):
    """A uvicorn.Server that checks for shutdown once a second instead of every 100 ms.

    An idle exporter is mostly this loop: two servers (metrics, events) at 10 wakeups/s each cost more
    CPU than collecting 8 GPUs. Shutdown now takes up to a second longer, which nobody notices.
    """

    async def main_loop(self) -> None:
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864_000  # on_tick refreshes the Date header when counter % 10 == 0
            await asyncio.sleep(TICK_SECONDS)
            should_exit = await self.on_tick(counter)


class ServerThread:
    """A QuietServer serving `app` on already-bound sockets from a background thread."""

    def __init__(self, app: object, sockets: list[socket.socket], name: str,
                 http: type[asyncio.Protocol] | str = "httptools") -> None:
        self.server = QuietServer(uvicorn.Config(
            app, log_config=None, access_log=False, lifespan="off", http=http))  # type: ignore[arg-type]
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": sockets}, name=name,
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
