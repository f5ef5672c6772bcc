#!/usr/bin/env python3
"""A TCP forwarder for the runtime's end-to-end test: listen on LISTEN (host:port) and copy every
connection's bytes both ways to TARGET (host:port). Python's standard library only.

The test runs one inside each node's network namespace (127.0.0.1:P there -> the host's end of
the node's link) and one on the host (that address -> Capstan on 127.0.0.1:P), so a node's agent
and its container engine reach Capstan at http://127.0.0.1:P as on a single machine, while each
node keeps its own network (docs/runtime.md, "Testing").

    forward.py 127.0.0.1:18080 10.231.1.1:18080
"""
import asyncio
import sys


def address(text):
    host, port = text.rsplit(":", 1)
    return host, int(port)


async def pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except Exception:
            pass


async def main():
    (listen_host, listen_port), (target_host, target_port) = address(sys.argv[1]), address(sys.argv[2])

    async def handle(client_reader, client_writer):
        try:
            target_reader, target_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, target_writer), pipe(target_reader, client_writer))

    server = await asyncio.start_server(handle, listen_host, listen_port, reuse_address=True)
    print(f"forwarding {sys.argv[1]} -> {sys.argv[2]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: forward.py LISTEN_HOST:PORT TARGET_HOST:PORT")
    asyncio.run(main())
