"""A bounded load test of the extender's HTTP server: loopback only, a fixed count of calls.

    python -m benchmarks.extender_load --clients 64 --calls 30 --nodes 100 [--server aiohttp] [--json OUT.json]

The real :class:`scheduler_extender.server.ExtenderServer` (default limits; ``--server aiohttp``:
the same handler behind aiohttp, the comparison the HTTP kernel was chosen by) runs in a child
process with a synthetic cache of ``--nodes`` GPU nodes (the cache code the watch feeds);
``--clients`` threads in this process each open their own keep-alive connection at the same
moment and make ``--calls`` calls, alternating ``/filter`` and ``/prioritize`` for an RL worker
over every node. Reported: calls, connection errors (resets, refusals, timeouts), 5xx, and
client-measured round-trip p50/p99/max. It fails (exit 1) on any connection error or 5xx.
I/O: loopback sockets and one child process; nothing else.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any


@dataclass
class LoadResult:
    clients: int
    calls: int
    ok: int
    errors: int  # connection reset / refused / timed out
    server_errors: int  # 5xx
    p50_ms: float
    p99_ms: float
    max_ms: float
    wall_s: float
    first_error: str = ""
    server: str = "kernel"
    # --slowloris: seconds until the server closed a connection that sends a header byte every
    # 0.5 s (None: still open after SLOWLORIS_WAIT_S)
    slowloris_closed_s: float | None = None


SLOWLORIS_WAIT_S = 20.0


def slowloris(port: int, wait_s: float = SLOWLORIS_WAIT_S) -> float | None:
    """Seconds until the server closes a connection whose request headers drip a byte every 0.5 s."""
    import socket

    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\n")
        s.settimeout(0.5)
        while time.monotonic() - t0 < wait_s:
            try:
                s.sendall(b"X")
                if s.recv(4096) == b"":
                    return round(time.monotonic() - t0, 1)
            except TimeoutError:
                continue
            except OSError:
                return round(time.monotonic() - t0, 1)
    return None


def _pods_and_nodes(nodes: int) -> tuple[dict[str, list[str]], list[tuple[str, dict[str, Any]]]]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.support
    from tests.support.extender_fixtures import pod  # the same fixtures the contract tier uses

    names = [f"node-{i:05d}" for i in range(nodes)]
    objs = [("Pod", pod(f"rl-{i}", f"uid-rl-{i}", node_name=n, job="grpo")) for i, n in enumerate(names[::4])]
    return {"pool-a": names[: nodes // 2], "pool-b": names[nodes // 2 :]}, objs


SERVERS = ("kernel", "aiohttp")


def _serve(nodes: int, conn: Connection, server: str = "kernel") -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.support
    from scheduler_extender.server import Extender, ExtenderServer, settle_heap
    from tests.support.extender_fixtures import cluster_cache

    sys.setswitchinterval(0.0005)  # what `rose extender` sets (--gil-switch-interval)
    pools, objs = _pods_and_nodes(nodes)
    extender = Extender(cluster_cache(pools, gpus=8, objects=objs))
    settle_heap()
    if server == "aiohttp":
        _serve_aiohttp(extender, conn)
        return
    srv = ExtenderServer(extender, "127.0.0.1", 0).start()
    conn.send(srv.port)
    conn.recv()  # until the parent is done
    srv.stop()


def _serve_aiohttp(extender: Any, conn: Connection) -> None:
    """The same verb handler behind aiohttp (its defaults, keep-alive 60 s like the kernel's idle
    timeout, the extender's body limit), for the comparison the kernel was chosen by."""
    import asyncio

    from aiohttp import web

    from scheduler_extender import wire

    async def verb(request: web.Request) -> web.Response:
        code, out = extender.handle(request.match_info["verb"], await request.read())
        return web.Response(status=code, body=out, content_type="application/json")

    async def main() -> None:
        app = web.Application(client_max_size=wire.max_body_bytes())
        app.router.add_post("/{verb:filter|prioritize|preempt}", verb)
        runner = web.AppRunner(app, access_log=None, keepalive_timeout=60.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=128)
        await site.start()
        server = site._server
        assert server is not None
        conn.send(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        await runner.cleanup()

    asyncio.run(main())


def _bodies(nodes: int) -> dict[str, bytes]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.support
    from tests.support.extender_fixtures import args_body, pod

    names = [f"node-{i:05d}" for i in range(nodes)]
    body = args_body(pod("w", "uid-w", job="grpo"), names)
    return {"/filter": body, "/prioritize": body}


def _client(
    port: int, calls: int, bodies: dict[str, bytes], start: threading.Barrier, out: list[Any], timeout_s: float
) -> None:
    lat: list[float] = []
    codes: list[int] = []
    err = ""
    start.wait()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    paths = list(bodies)
    try:
        for i in range(calls):
            path = paths[i % len(paths)]
            t0 = time.perf_counter()
            conn.request("POST", path, body=bodies[path], headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            lat.append(time.perf_counter() - t0)
            codes.append(resp.status)
    except (OSError, http.client.HTTPException) as e:
        err = repr(e)
    finally:
        conn.close()
    out.append((lat, codes, err, calls - len(codes)))


def run(
    clients: int = 64,
    calls: int = 30,
    nodes: int = 100,
    timeout_s: float = 30.0,
    server: str = "kernel",
    with_slowloris: bool = False,
) -> LoadResult:
    """Start the server, run the load, stop the server; the figures."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(nodes, child, server), daemon=True)
    proc.start()
    try:
        if not parent.poll(60):
            raise RuntimeError("extender server did not start within 60 s")
        port = int(parent.recv())
        bodies = _bodies(nodes)
        start = threading.Barrier(clients)
        out: list[Any] = []
        threads = [
            threading.Thread(target=_client, args=(port, calls, bodies, start, out, timeout_s)) for _ in range(clients)
        ]
        slow: list[float | None] = []
        if with_slowloris:
            threads.append(threading.Thread(target=lambda: slow.append(slowloris(port))))
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads[:clients]:
            t.join()
        wall = time.perf_counter() - t0
        for t in threads[clients:]:
            t.join()
    finally:
        parent.send("stop")
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    lat = sorted(x for o in out for x in o[0])
    codes = [c for o in out for c in o[1]]
    errs = [o[2] for o in out if o[2]]
    q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else [lat[0] if lat else 0.0] * 99
    return LoadResult(
        clients=clients,
        calls=clients * calls,
        ok=sum(1 for c in codes if c == 200),
        errors=len(errs) + sum(o[3] for o in out if not o[2]),
        server_errors=sum(1 for c in codes if c >= 500),
        p50_ms=round(q[49] * 1000, 2),
        p99_ms=round(q[98] * 1000, 2),
        max_ms=round((lat[-1] if lat else 0.0) * 1000, 2),
        wall_s=round(wall, 2),
        first_error=errs[0] if errs else "",
        server=server,
        slowloris_closed_s=slow[0] if slow else None,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.extender_load", description=__doc__)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--calls", type=int, default=30, help="calls per client")
    p.add_argument("--nodes", type=int, default=100, help="nodes in the cache and in each call")
    p.add_argument("--json", type=Path, default=None, help="write the result here too")
    p.add_argument("--server", choices=SERVERS, default="kernel", help="kernel: rose_common.httpserver (default)")
    p.add_argument("--slowloris", action="store_true", help="also time how long a dripping client is kept (<= 20 s)")
    args = p.parse_args(argv)
    for name in ("clients", "calls", "nodes"):
        if not 1 <= getattr(args, name) <= 5_000:
            p.error(f"--{name} must be in [1, 5000], got {getattr(args, name)}")
    res = run(args.clients, args.calls, args.nodes, server=args.server, with_slowloris=args.slowloris)
    text = json.dumps(asdict(res), indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if res.errors == 0 and res.server_errors == 0 and res.ok == res.calls else 1


if __name__ == "__main__":
    raise SystemExit(main())
