# ruff: noqa  (a harness recorded as it was run, for the figures in NOTES.md)
"""Bare gRPC relay floor: worker (aio server) -> controller (aio server relaying bytes) ->
client (sync, SingleThreadedUnaryStream). CPU per message of each process."""

import asyncio
import os
import socket
import subprocess
import sys
import time

import grpc
import grpc.experimental


def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


MSG = b"x" * 48


async def worker(p):
    async def stream(req, ctx):
        n, period = [float(x) for x in req.decode().split()]
        nxt = time.perf_counter()
        for _ in range(int(n)):
            nxt += period
            await asyncio.sleep(max(0, nxt - time.perf_counter()))
            yield MSG

    h = grpc.method_handlers_generic_handler(
        "w", {"S": grpc.unary_stream_rpc_method_handler(stream)}
    )
    s = grpc.aio.server()
    s.add_generic_rpc_handlers((h,))
    s.add_insecure_port(f"127.0.0.1:{p}")
    await s.start()
    await s.wait_for_termination()


async def controller(p, wp):
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{wp}")
    up = ch.unary_stream("/w/S")

    async def stream(req, ctx):
        async for m in up(req):
            yield m

    h = grpc.method_handlers_generic_handler(
        "c", {"S": grpc.unary_stream_rpc_method_handler(stream)}
    )
    s = grpc.aio.server()
    s.add_generic_rpc_handlers((h,))
    s.add_insecure_port(f"127.0.0.1:{p}")
    await s.start()
    await s.wait_for_termination()


def sync_controller(p, wp):
    from concurrent import futures

    ch = grpc.insecure_channel(
        f"127.0.0.1:{wp}",
        options=((grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),),
    )
    up = ch.unary_stream("/w/S")

    def stream(req, ctx):
        yield from up(req)

    h = grpc.method_handlers_generic_handler(
        "c", {"S": grpc.unary_stream_rpc_method_handler(stream)}
    )
    s = grpc.server(futures.ThreadPoolExecutor(4))
    s.add_generic_rpc_handlers((h,))
    s.add_insecure_port(f"127.0.0.1:{p}")
    s.start()
    s.wait_for_termination()


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "sync_controller":
        sync_controller(int(sys.argv[2]), int(sys.argv[3]))
    if role == "worker":
        asyncio.run(worker(int(sys.argv[2])))
    elif role == "controller":
        asyncio.run(controller(int(sys.argv[2]), int(sys.argv[3])))
    else:
        n, period = int(sys.argv[1]), float(sys.argv[2])
        wp, cp = port(), port()
        w = subprocess.Popen([sys.executable, __file__, "worker", str(wp)])
        c = subprocess.Popen(
            [sys.executable, __file__, os.environ.get("CTRL", "controller"), str(cp), str(wp)]
        )
        time.sleep(2)
        ch = grpc.insecure_channel(
            f"127.0.0.1:{cp}",
            options=((grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1),),
        )
        call = ch.unary_stream("/c/S")
        for _ in call(b"50 0.001"):
            pass
        for rnd in range(3):
            a = (cpu(w.pid), cpu(c.pid), time.process_time())
            t0 = time.perf_counter()
            k = sum(1 for _ in call(f"{n} {period}".encode()))
            el = time.perf_counter() - t0
            b = (cpu(w.pid), cpu(c.pid), time.process_time())
            print(
                f"{k} msgs in {el:.2f}s; us CPU per message: worker {(b[0] - a[0]) * 1e6 / k:.0f} controller {(b[1] - a[1]) * 1e6 / k:.0f} client {(b[2] - a[2]) * 1e6 / k:.0f}"
            )
        w.kill()
        c.kill()
