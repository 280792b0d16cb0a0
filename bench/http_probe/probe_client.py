#!/usr/bin/env python3
"""Opens N concurrent SSE streams (POST /v1/completions, stream: true) against a probe server
(probe_server.cpp) whose tokens carry their emit time on CLOCK_MONOTONIC, and reports whether all
were held to the end and how late tokens arrived. Standard library only (asyncio sockets), so the
client itself costs little CPU beside the server on a small machine.
  probe_client.py PORT N_STREAMS TOKENS_PER_STREAM
Prints one JSON object."""
import asyncio
import json
import sys
import time


async def one_stream(port, n_tokens, lat, ok, first):
    t0 = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"prompt": "probe", "max_tokens": n_tokens, "stream": True}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    got, done, buf = 0, False, b""
    while not done:
        data = await reader.read(65536)
        if not data:
            break
        now = time.monotonic()
        buf += data
        # Chunked framing is ignored: SSE lines are found by their "data: " prefix.
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            i = ev.find(b"data: ")
            if i < 0:
                continue
            payload = ev[i + 6:]
            if payload.startswith(b"[DONE]"):
                done = True
                break
            j = json.loads(payload)
            for tok in j["choices"][0]["text"].split():
                if got == 0:
                    first.append(now - t0)
                lat.append(now - float(tok))
                got += 1
    writer.close()
    ok.append(done and got == n_tokens)


async def main():
    port, n, n_tokens = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    lat, ok, first = [], [], []
    t0 = time.monotonic()
    await asyncio.gather(*(one_stream(port, n_tokens, lat, ok, first) for _ in range(n)), return_exceptions=True)
    lat.sort()
    first.sort()
    q = lambda v, p: v[min(len(v) - 1, int(p * len(v)))] * 1e3 if v else None
    print(json.dumps({"streams": n, "streams_complete": sum(ok), "tokens": len(lat),
                      "token_latency_p50_ms": q(lat, 0.5), "token_latency_p99_ms": q(lat, 0.99),
                      "token_latency_max_ms": q(lat, 1.0), "first_token_p50_ms": q(first, 0.5),
                      "first_token_p99_ms": q(first, 0.99), "wall_s": time.monotonic() - t0}))


asyncio.run(main())
