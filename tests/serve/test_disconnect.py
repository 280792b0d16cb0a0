"""Streaming clients that leave: 1,000 streaming requests in waves of bounded concurrency, 30% of
which close their socket after the first event or a few (half with a FIN, half with a RST). After
they finish, no KV page is leaked (/metrics: pool used 0, kv_check 1), no stream is left open, the
cancelled requests are counted as disconnects, and the server still answers correctly."""
from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import struct
import time
from collections import Counter

import pytest

from dhs_server import as_cli_prints, assert_pool_clean, generate_alone

pytestmark = [pytest.mark.disconnect, pytest.mark.slow]

N_REQUESTS = int(os.environ.get("DHS_DISCONNECT_N", "1000"))
CONCURRENCY = 32
LEAVE_FRACTION = 0.3
SEED = 21
SUBJECTS = ["tea", "maps", "wolves", "glass", "jazz", "tides", "salt", "kites", "caves", "ink"]


def request_bytes(port: int, i: int, rng: random.Random, leaves: bool) -> bytes:
    chat = rng.random() < 0.5
    subject = SUBJECTS[i % len(SUBJECTS)]
    body: dict = {"stream": True, "temperature": rng.choice([0, 0.8]), "seed": i}
    # Leavers ask for more than they will read, so the request is still running when they go.
    body["max_tokens"] = 64 if leaves else rng.randint(2, 6)
    body["ignore_eos"] = leaves
    if rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    if chat:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": f"Say something about {subject} ({i})."}]
    else:
        path = "/v1/completions"
        body["prompt"] = f"A note on {subject}, number {i}:"
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data


async def one(port: int, i: int, rng: random.Random, leaves: bool, stats: Counter) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_bytes(port, i, rng, leaves))
    await writer.drain()
    leave_after = rng.choice([1, 1, 2, 3, 5])  # events (the role chunk counts) before leaving
    rst = rng.random() < 0.5
    got = b""
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), 120)
            if not chunk:
                break
            got += chunk
            if not got.startswith(b"HTTP/1.1 200"):
                if b"\r\n\r\n" in got:
                    stats["status " + got.split(b" ", 2)[1].decode()] += 1
                    return
                continue
            if leaves and got.count(b"data: ") >= leave_after:
                if rst:  # SO_LINGER 0: close() sends a RST instead of a FIN
                    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                               struct.pack("ii", 1, 0))
                stats["left (rst)" if rst else "left (fin)"] += 1
                return
            if b"data: [DONE]" in got:
                break
        if b"data: [DONE]" in got:
            stats["done"] += 1
            if b'"finish_reason":"abort"' in got or b'"error"' in got:
                stats["done with abort/error"] += 1
        else:
            stats["ended without [DONE]"] += 1
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def run_waves(port: int) -> Counter:
    rng = random.Random(SEED)
    leaves = [rng.random() < LEAVE_FRACTION for _ in range(N_REQUESTS)]
    stats: Counter = Counter()
    sem = asyncio.Semaphore(CONCURRENCY)

    async def guarded(i):
        async with sem:
            await one(port, i, random.Random(f"{SEED}-{i}"), leaves[i], stats)

    await asyncio.gather(*(guarded(i) for i in range(N_REQUESTS)))
    stats["planned leavers"] = sum(leaves)
    return stats


def test_thousand_streams_30pct_leave(server):
    before = server.metrics()
    t0 = time.monotonic()
    stats = asyncio.run(run_waves(server.port))
    secs = time.monotonic() - t0
    print(f"\n{N_REQUESTS} streams in {secs:.1f} s: {dict(stats)}")
    m = server.wait_idle(timeout_s=15)
    assert_pool_clean(m)
    assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0, m
    assert m["dhisparse:http_open_streams"] == 0, m["dhisparse:http_open_streams"]
    left = stats["left (rst)"] + stats["left (fin)"]
    assert left == stats["planned leavers"], stats
    assert stats["done"] == N_REQUESTS - left, stats
    assert stats["done with abort/error"] == 0 and stats["ended without [DONE]"] == 0, stats
    disconnects = m["dhisparse:http_stream_disconnects_total"] - before.get("dhisparse:http_stream_disconnects_total", 0)
    aborts = m['vllm:request_success_total{finished_reason="abort"}'] - \
        before.get('vllm:request_success_total{finished_reason="abort"}', 0)
    print(f"server: {disconnects:.0f} stream disconnects, {aborts:.0f} requests aborted, "
          f"{m['vllm:generation_tokens_total']:.0f} tokens generated")
    # A leaver asked for 64 tokens and read at most 5 events: its request cannot have finished.
    assert disconnects == left, (disconnects, left)
    assert aborts == left, (aborts, left)
    # And the server still answers correctly.
    prompt = "The capital of France is"
    status, r = server.post_json("/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0})
    assert status == 200, r
    assert as_cli_prints(r["choices"][0]["text"]) == generate_alone(prompt, 12)
