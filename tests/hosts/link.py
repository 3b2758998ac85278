"""A slow, lossy link in front of the db host's PostgreSQL, for scenario 5. This machine's kernel
has no ``sch_netem`` (nor ``tc`` actions, nor netfilter), so ``netem delay 50ms 20ms loss 5%``
cannot be set on a veth here; this relay, on the db host, does the same to the TCP streams
that pass it: each chunk a side sends is delivered ``delay`` +/- ``jitter`` ms later (in order,
as TCP would), and with probability ``loss`` a chunk waits one more retransmission timeout
(200 ms, Linux's minimum RTO), which is what a lost segment costs a TCP stream. It writes
``stats.json`` (connections, chunks each way, chunks "lost") every second.

    python -m tests.hosts.link LISTEN_PORT TARGET_PORT DELAY_MS JITTER_MS LOSS STATS"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from pathlib import Path

RTO = 0.2


class Link:
    def __init__(self, target: int, delay: float, jitter: float, loss: float) -> None:
        self.target, self.delay, self.jitter, self.loss = target, delay, jitter, loss
        self.rng = random.Random(38)
        self.stats = {"connections": 0, "chunks_up": 0, "chunks_down": 0, "lost": 0}

    def _lag(self) -> float:
        lag = max(0.0, self.rng.uniform(self.delay - self.jitter, self.delay + self.jitter))
        if self.rng.random() < self.loss:
            self.stats["lost"] += 1
            lag += RTO
        return lag

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    counter: str) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    writer.close()
                    return
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(deliver())
        last = 0.0
        try:
            while data := await reader.read(65536):
                self.stats[counter] += 1
                last = max(last, time.monotonic() + self._lag())  # in order, as TCP delivers
                queue.put_nowait((last, data))
        finally:
            queue.put_nowait((last, b""))
            await sender

    async def handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.stats["connections"] += 1
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target)
        await asyncio.gather(self._pipe(client_r, server_w, "chunks_up"),
                             self._pipe(server_r, client_w, "chunks_down"),
                             return_exceptions=True)


async def main(port: int, target: int, delay_ms: float, jitter_ms: float, loss: float,
               stats: Path) -> None:
    link = Link(target, delay_ms / 1000, jitter_ms / 1000, loss)
    server = await asyncio.start_server(link.handle, "0.0.0.0", port)
    print(f"link on :{port} -> 127.0.0.1:{target}, {delay_ms} ms +/- {jitter_ms}, "
          f"loss {loss:.0%}", flush=True)
    async with server:
        while True:
            stats.write_text(json.dumps(link.stats))
            await asyncio.sleep(1)


if __name__ == "__main__":
    port, target, delay, jitter, loss, out = sys.argv[1:7]
    asyncio.run(main(int(port), int(target), float(delay), float(jitter), float(loss), Path(out)))
