"""pytest glue for the `dhisparse serve` end-to-end tests (tests/serve/).

A test module says how its server starts with module attributes:
  SERVER_ARGS = ["--max-waiting", "2"]    # extra flags after `serve MODEL --port 0`
  SERVER_API_KEY = "sesame"               # start with --api-key, send it from the helpers
and takes the module-scoped `server` fixture (dhs_server.Server). The binary and the model come
from DHS_BIN and DHS_MODEL (defaults: build/dhisparse, models/SmolLM2-135M-Instruct.Q4_1.gguf).
"""
from __future__ import annotations

import os
import sys
import time
from collections import defaultdict

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import dhs_server  # noqa: E402

_file_seconds: dict[str, float] = defaultdict(float)


def pytest_configure(config):
    for name, text in [
        ("openai_client", "the official openai client against the server"),
        ("concurrency", "many requests at once; greedy outputs against `generate` alone"),
        ("preemption", "a tiny KV pool forces preemption"),
        ("hostile", "malformed and hostile requests (the fuzzer)"),
        ("disconnect", "streaming clients that leave mid-stream"),
        ("slow", "takes more than a minute on 2 cores"),
    ]:
        config.addinivalue_line("markers", f"{name}: {text}")


def pytest_collection_modifyitems(config, items):
    if not os.path.exists(dhs_server.model_path()):
        skip = pytest.mark.skip(reason=f"no model at {dhs_server.model_path()} (scripts/fetch_model.sh)")
    elif not dhs_server.has_serve_command():
        skip = pytest.mark.skip(reason=f"{dhs_server.bin_path()} has no serve command")
    else:
        return
    for item in items:
        item.add_marker(skip)


@pytest.fixture(scope="module")
def server(request):
    args = list(getattr(request.module, "SERVER_ARGS", []))
    key = getattr(request.module, "SERVER_API_KEY", None)
    name = request.module.__name__.rsplit(".", 1)[-1]
    srv = dhs_server.Server(args, api_key=key, name=name)
    srv.start()
    try:
        yield srv
    except BaseException:
        srv.kill()
        raise
    # Teardown: SIGTERM, exit status 0 within the bound (raises otherwise).
    if srv.alive():
        srv.stop()
    else:
        srv.kill()
        pytest.fail(f"the server died during {name}: status {srv.proc.returncode}\n{srv.log_tail()}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    t0 = time.monotonic()
    yield
    _file_seconds[item.location[0]] += time.monotonic() - t0


def pytest_terminal_summary(terminalreporter):
    if not _file_seconds:
        return
    terminalreporter.write_sep("-", "runtime per file (setup and teardown included)")
    for path, s in sorted(_file_seconds.items()):
        terminalreporter.write_line(f"{s:8.1f} s  {path}")
    terminalreporter.write_line(f"{sum(_file_seconds.values()):8.1f} s  total")
