"""The KV hierarchy through the server (`--cpu-kv-gb`, `--kv-device-budget`; docs/hierarchy.md):
with a device budget of about one layer's pages per request, pages move between the tiers at every
layer of every step, and a greedy request's text still equals `dhisparse generate` alone with every
page resident; /metrics counts the moves, and afterwards both tiers are empty and consistent.
Requests run one after another (on a sparse server a decode row sharing its step with another
request's prefill chunk reads every page: test_request_policy.py says more)."""
from __future__ import annotations

import pytest

from dhs_server import as_cli_prints, assert_pool_clean, device_args, generate_alone

# The layer schedule (the default) is the CPU's: the CUDA server refuses it and runs the
# recall-ahead schedule (test_kv_tiers_ahead.py).
pytestmark = pytest.mark.skipif("cuda" in device_args(), reason="the layer schedule runs on the CPU backend only")

SERVER_POLICY = "coverage:0.99"
# ~700 tokens: 44 pages per (layer, KV head); 3 KV heads: one layer's pages are ~132.
SERVER_ARGS = ["--sparse-policy", SERVER_POLICY, "--cpu-kv-gb", "1", "--kv-device-budget", "140", "--max-num-seqs", "4"]
PROMPTS = [("The harbour master wrote down every ship that docked at pier " + str(i) + ". " * 1) * 60
           + "\nThe last ship that docked was named" for i in range(3)]
MAX_TOKENS = 16


def test_greedy_text_equals_all_resident(server):
    m0 = server.metrics()
    for prompt in PROMPTS:
        want = generate_alone(prompt, MAX_TOKENS, ignore_eos=True, args=["--sparse-policy", SERVER_POLICY])
        status, body = server.post_json("/v1/completions", {"prompt": prompt, "max_tokens": MAX_TOKENS,
                                                            "temperature": 0, "ignore_eos": True}, timeout=600)
        assert status == 200, body
        assert as_cli_prints(body["choices"][0]["text"]) == want
    m = server.wait_idle()
    recalled = m["dhisparse:kv_tier_recalled_total"] - m0.get("dhisparse:kv_tier_recalled_total", 0)
    offloaded = m["dhisparse:kv_tier_offloaded_total"] - m0.get("dhisparse:kv_tier_offloaded_total", 0)
    assert recalled > 0 and offloaded > 0, (recalled, offloaded)
    assert m["dhisparse:kv_tier_host_used_pages"] == 0
    assert_pool_clean(m)
