"""Starts and stops `dhisparse serve` for the end-to-end tests, and the small helpers they share.

The server is started on port 0 (it picks a free port and prints it on stderr, so there is no
race between choosing a port and binding it), polled on /health until 200 within a bound, and
stopped with SIGTERM; its exit status must be 0 within a bound. Its stderr goes to a log file
that failures print the tail of.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def bin_path() -> str:
    return os.environ.get("DHS_BIN", str(ROOT / "build" / "dhisparse"))


def model_path() -> str:
    return os.environ.get("DHS_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))


def device_args() -> list[str]:
    """DHS_DEVICE=cuda runs the server and `generate` alone on the GPU (the device's serve stage)."""
    dev = os.environ.get("DHS_DEVICE", "")
    return ["--device", dev] if dev else []


def has_serve_command(binary: str | None = None) -> bool:
    binary = binary or bin_path()
    if not os.path.exists(binary):
        return False
    r = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True, timeout=30)
    return r.returncode == 0


class ServerError(AssertionError):
    pass


class Server:
    """One `dhisparse serve` process. Use as a context manager or call start() / stop()."""

    def __init__(self, args: list[str] | None = None, *, api_key: str | None = None,
                 start_timeout_s: float = 120.0, stop_timeout_s: float = 30.0, name: str = "serve"):
        self.args = list(args or [])
        self.api_key = api_key
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.returncode: int | None = None
        self._log_dir = tempfile.mkdtemp(prefix=f"dhs-{name}-")
        self.log_path = Path(self._log_dir) / "stderr.log"

    # --- lifecycle --------------------------------------------------------------------------
    def command(self) -> list[str]:
        cmd = [bin_path(), "serve", model_path(), "--port", "0", "--host", "127.0.0.1"]
        if self.api_key:
            cmd += ["--api-key", self.api_key]
        return cmd + device_args() + self.args

    def start(self) -> "Server":
        cmd = self.command()
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.start_timeout_s
        while self.port is None:
            self._check_alive("while starting")
            m = re.search(rb"listening on http://[^:\s]+:(\d+)", self.log_path.read_bytes())
            if m:
                self.port = int(m.group(1))
                break
            if time.monotonic() > deadline:
                self.kill()
                raise ServerError(f"no 'listening on' line within {self.start_timeout_s} s\n{self.log_tail()}")
            time.sleep(0.05)
        while True:
            self._check_alive("while loading")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return self
            except urllib.error.HTTPError as e:
                if e.code != 503:
                    raise ServerError(f"/health answered {e.code} while loading\n{self.log_tail()}")
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise ServerError(f"/health not 200 within {self.start_timeout_s} s\n{self.log_tail()}")
            time.sleep(0.1)

    def stop(self, expect_rc: int | None = 0) -> int:
        """SIGTERM, then wait stop_timeout_s for the exit; returns the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
                raise ServerError(f"did not exit within {self.stop_timeout_s} s of SIGTERM\n{self.log_tail()}")
        self.returncode = self.proc.returncode
        self._log.close()
        if expect_rc is not None and self.returncode != expect_rc:
            raise ServerError(f"exit status {self.returncode}, expected {expect_rc}\n{self.log_tail()}")
        return self.returncode

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.stop()
        else:
            self.kill()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _check_alive(self, when: str) -> None:
        if not self.alive():
            rc = self.proc.returncode if self.proc else None
            raise ServerError(f"the server exited (status {rc}) {when}\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return "--- server stderr (tail) ---\n" + data[-n:].decode("utf-8", "replace")

    # --- addresses and plain requests -------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """What the openai client takes as base_url."""
        return self.url + "/v1"

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def get(self, path: str, timeout: float = 30) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, headers=self.headers())
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def post_json(self, path: str, body: dict, timeout: float = 120) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), headers=self.headers(),
                                     method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def metrics(self) -> dict[str, float]:
        status, body = self.get("/metrics")
        if status != 200:
            raise ServerError(f"/metrics answered {status}: {body[:300]!r}")
        return parse_metrics(body.decode())

    def wait_idle(self, timeout_s: float = 15.0) -> dict[str, float]:
        """Metrics once nothing runs or waits, the KV pool is empty and no SSE stream is open (or the
        last look at timeout). (A stream's handler writes its last chunk and closes after the
        scheduler has finished its request: on a loaded machine the open-stream gauge lags.)"""
        deadline = time.monotonic() + timeout_s
        while True:
            m = self.metrics()
            idle = (m.get("vllm:num_requests_running", 0) == 0 and m.get("vllm:num_requests_waiting", 0) == 0
                    and m.get("dhisparse:kv_pool_used_blocks", 0) == 0 and m.get("dhisparse:http_open_streams", 0) == 0)
            if idle or time.monotonic() > deadline:
                return m
            time.sleep(0.1)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name: value} for unlabelled-but-model samples, and {name{labels}: value}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if not m:
            raise ValueError(f"unparsable metrics line: {line!r}")
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        extra = re.sub(r'model_name="(?:[^"\\]|\\.)*",?', "", labels)
        key = name if extra in ("", "{}") else name + extra.replace("{,", "{")
        out[key] = value
    return out


def assert_pool_clean(m: dict[str, float]) -> None:
    used = m.get("dhisparse:kv_pool_used_blocks")
    free, total = m.get("dhisparse:kv_pool_free_blocks"), m.get("dhisparse:kv_pool_total_blocks")
    assert used == 0, f"KV pool: {used} blocks still used after the load (free {free}, total {total})"
    assert free == total, f"KV pool: free {free} != total {total}"
    assert m.get("dhisparse:kv_check_ok") == 1, "dhisparse:kv_check_ok is not 1 (pool accounting broken)"


def assert_error_object(status: int, body: bytes | str | dict, context: str = "") -> dict:
    """A 4xx body must be OpenAI's error object: {"error": {"message": str, "type": str, ...}}."""
    if isinstance(body, dict):
        obj = body
    else:
        try:
            obj = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise AssertionError(f"HTTP {status}: body is not JSON ({e}): {body[:200]!r} {context}")
    assert isinstance(obj, dict) and isinstance(obj.get("error"), dict), \
        f"HTTP {status}: not an error object: {str(obj)[:300]} {context}"
    err = obj["error"]
    assert isinstance(err.get("message"), str) and err["message"], f"HTTP {status}: error.message: {err} {context}"
    assert isinstance(err.get("type"), str) and err["type"], f"HTTP {status}: error.type: {err} {context}"
    return err


# --- the CLI oracle ---------------------------------------------------------------------------
_alone_cache: dict[tuple, str] = {}
_alone_lock = threading.Lock()


def generate_alone(prompt: str, max_tokens: int, *, chat: bool = False, stop: list[str] | None = None,
                   ignore_eos: bool = False, sampling: dict | None = None, threads: int = 1,
                   timeout: float = 300, args: list[str] | None = None) -> str:
    """What `dhisparse generate -q` prints for this prompt run alone (greedy unless `sampling` says
    otherwise, in the server's field names; `args`: more flags of generate): the text, then a
    newline unless the text is empty or already ends in one. Compare with as_cli_prints(text)."""
    sampling = dict(sampling or {})
    key = (prompt, max_tokens, chat, tuple(stop or ()), ignore_eos, tuple(sorted(sampling.items())), tuple(args or ()))
    with _alone_lock:
        if key in _alone_cache:
            return _alone_cache[key]
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        # -f strips one trailing newline: add one so that a prompt's own last newline survives.
        f.write(prompt.encode() + b"\n")
        prompt_file = f.name
    try:
        cmd = [bin_path(), "generate", "-m", model_path(), "-f", prompt_file, "-n", str(max_tokens), "-q",
               "--no-escape", "-t", str(threads)] + device_args()
        # sampling: the server's names -> generate's flags (greedy when empty).
        flags = {"temperature": "--temperature", "top_p": "--top-p", "top_k": "--top-k", "min_p": "--min-p",
                 "seed": "--seed", "repetition_penalty": "--repeat-penalty"}
        sampling.setdefault("temperature", 0)
        for k, v in sampling.items():
            cmd += [flags[k], str(v)]
        if "repetition_penalty" in sampling:
            cmd += ["--repeat-last-n", "0"]  # the server's penalty looks at the whole context, as vLLM's
        if chat:
            cmd.append("--chat")
        for s in stop or []:
            cmd += ["--stop", s]
        if ignore_eos:
            cmd.append("--ignore-eos")
        cmd += list(args or [])  # e.g. --sparse-policy
        r = subprocess.run(cmd, capture_output=True, timeout=timeout)
    finally:
        os.unlink(prompt_file)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.decode(errors='replace')[-2000:]}")
    out = r.stdout.decode("utf-8")
    with _alone_lock:
        _alone_cache[key] = out
    return out


def as_cli_prints(text: str) -> str:
    """The server's text as `generate -q` would print it (src/cli/stdout_writer.cpp ends the
    output with a newline only when the text does not already end in one)."""
    return text + "\n" if text and not text.endswith("\n") else text


@contextlib.contextmanager
def timed(label: str):
    t0 = time.monotonic()
    yield
    print(f"[{label}: {time.monotonic() - t0:.1f} s]", flush=True)
