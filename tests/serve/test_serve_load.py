"""bench/serve_load.py, the load generator whose rows make bench/results/serve.jsonl, run as the GPU
runs it (`--launch`) against a server with the KV hierarchy: the row must carry what the server's
/metrics says about the tiers. Until session 32 the scraper kept a list of metric names that lacked
the admission's price and deferrals, so those rows silently went without them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dhs_server import device_args

ROOT = Path(__file__).resolve().parents[2]

# The layer schedule is the CPU's (test_kv_tiers.py); about one layer's pages per request in HBM.
pytestmark = pytest.mark.skipif("cuda" in device_args(), reason="the layer schedule runs on the CPU backend only")


def test_a_row_with_the_host_tier_carries_the_tiers_figures(tmp_path):
    results = tmp_path / "serve.jsonl"
    cmd = [sys.executable, str(ROOT / "bench" / "serve_load.py"), "--launch", "--server-args",
           "--sparse-policy coverage:0.99 --cpu-kv-gb 1 --kv-device-budget 140 --max-num-seqs 2",
           "--dataset", "synthetic", "--prompt-len", "700", "--output-len", "8", "--num-prompts", "2",
           "--concurrency", "2", "--device", "cpu", "--results", str(results), "--no-tqdm", "--note", "test"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(rows) == 1
    row = rows[0]
    assert row["n_ok"] == 2 and row["n_failed"] == 0, row
    assert row["host_kv_gib"] == 1.0 and row["kv_device_budget"] == "140", row
    # Pages moved: a budget of ~140 pages against ~44 pages x 30 layers x 3 KV heads per request.
    assert row["tier_recalled_pages"] > 0 and row["tier_offloaded_pages"] > 0, row
    # (the layer schedule recalls a layer's pages before reading them: every read is a hit)
    assert row["tier_hit_rate"] == 1.0, row
    assert 0.0 < row["pages_read_frac"] <= 1.0, row
    # The admission's figures: a price per page (never below the link's, so > 0) and a count.
    assert row["kv_page_cost_us"] > 0.0, row
    assert row["admissions_deferred_io"] >= 0, row
