"""An origin on 127.0.0.1 that answers every GET after DELAY seconds with
`Cache-Control: no-store` (nothing is cached in front of it), keep-alive,
on asyncio: thousands of waiting requests cost no thread each. Prints
'ready PORT' and serves until killed or --seconds pass."""

import argparse
import asyncio

BODY = b"ok\n"
ANSWER = (b"HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Length: 3\r\nContent-Type: text/plain\r\n\r\n"
          + BODY)


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")          # GET only: no request body to skip
            if not head:
                break
            await asyncio.sleep(delay)
            writer.write(ANSWER)
            await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass
    finally:
        writer.close()


async def main(delay: float, seconds: float) -> None:
    server = await asyncio.start_server(lambda r, w: serve(r, w, delay), "127.0.0.1", 0, backlog=4096)
    print("ready", server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await asyncio.sleep(seconds)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--delay", type=float, default=0.3)
    ap.add_argument("--seconds", type=float, default=900)
    a = ap.parse_args()
    asyncio.run(main(a.delay, a.seconds))
