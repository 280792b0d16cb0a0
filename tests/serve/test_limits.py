"""--api-key and --max-waiting through the openai client: 401 without or with a wrong key on /v1
routes (and not on /health, /metrics), 429 with OpenAI's rate_limit_error once more than
--max-waiting requests wait, counted in /metrics; the pool empty afterwards."""
from __future__ import annotations

import asyncio

import openai
import pytest

from dhs_server import assert_error_object, assert_pool_clean

pytestmark = pytest.mark.openai_client

SERVER_API_KEY = "sesame-limits"
SERVER_ARGS = ["--max-num-seqs", "1", "--max-waiting", "2"]


def client_with(server, key, cls=openai.OpenAI):
    return cls(base_url=server.base_url, api_key=key, max_retries=0, timeout=120)


def test_api_key_required_on_v1(server):
    for key in ("wrong", SERVER_API_KEY + "x", "Bearer " + SERVER_API_KEY):
        with pytest.raises(openai.AuthenticationError) as e:
            client_with(server, key).models.list()
        assert e.value.status_code == 401
    import urllib.request, urllib.error
    for path in ("/v1/models", "/v1/completions"):
        req = urllib.request.Request(server.url + path, data=b"{}" if "compl" in path else None)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 401
        err = assert_error_object(401, e.value.read())
        assert err["type"] == "authentication_error"
    r = client_with(server, SERVER_API_KEY).completions.create(model="", prompt="Hi", max_tokens=2)
    assert r.choices[0].text is not None
    for path in ("/health", "/metrics", "/version"):
        with urllib.request.urlopen(server.url + path, timeout=10) as resp:
            assert resp.status == 200


def test_queue_full_is_429(server):
    before = server.metrics()

    async def one(c):
        try:
            await c.completions.create(model="", prompt="Count to twenty:", max_tokens=24, temperature=0,
                                       extra_body={"ignore_eos": True})
            return "ok"
        except openai.RateLimitError as e:
            assert e.status_code == 429
            assert e.body and e.body.get("type") == "rate_limit_error", e.body
            return "429"

    async def burst():
        c = client_with(server, SERVER_API_KEY, openai.AsyncOpenAI)
        try:
            return await asyncio.gather(*(one(c) for _ in range(10)))
        finally:
            await c.close()

    results = asyncio.run(burst())
    n429 = results.count("429")
    print(f"\n10 at once with --max-num-seqs 1 --max-waiting 2: {results.count('ok')} ok, {n429} got 429")
    # The queue holds 2, so the first two arrivals are always taken; whether the scheduler thread has
    # moved one into the single running slot before the third arrives is timing (a loaded CI machine
    # gave 2 ok), so 2 is the bound that holds, and 10 at once must overflow 1 + 2.
    assert results.count("ok") >= 2 and n429 >= 1, results
    m = server.wait_idle()
    assert_pool_clean(m)
    rejected = m["dhisparse:requests_rejected_queue_full_total"] - before["dhisparse:requests_rejected_queue_full_total"]
    assert rejected == n429, (rejected, n429)


def test_slow_first_request_is_answered(server):
    # A client that connects and takes 7 s to send its request (a starved process on a loaded
    # host) is answered: the server waits for a fresh connection's first request as long as for a
    # stalled one (10 s, server_options.h), not cpp-httplib's 5 s keep-alive default, which closed
    # such connections without an answer (CI saw httpx ReadErrors with 64 requests at once).
    import socket
    import time
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        time.sleep(7)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data[:200]


def test_listen_backlog_holds_many_connections_at_once(server):
    # cpp-httplib 0.11 listens with a backlog of 5; with 64 clients connecting at once and the accept
    # thread slow to run on a loaded host, the queue overflowed and some connections ended
    # unanswered (CI: httpx ReadErrors). The server widens it (http_server.cpp): the kernel's view
    # of the listening socket (ss's Send-Q is a listener's backlog) must hold at least 64.
    import shutil
    import subprocess
    if shutil.which("ss") is None:
        pytest.skip("no ss (iproute2) to read the listen backlog")
    out = subprocess.run(["ss", "-ltnH", f"sport = :{server.port}"], capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()]
    assert rows, f"no listening socket on port {server.port}: {out!r}"
    assert int(rows[0][2]) >= 64, f"listen backlog {rows[0][2]} (ss: {out!r})"
