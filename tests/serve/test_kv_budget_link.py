"""The cache manager's link rule through the server (`--kv-device-budget auto --kv-budget-io-share`;
docs/hierarchy.md "Budgets that follow the link"): after decode steps are measured, the miss target
the budgets are sized against is the misses whose crossings take that share of a decode step at a
page's measured price, no longer the fixed 2.5% (RunnerTiers' unit test holds the arithmetic); a
greedy request's text still equals `dhisparse generate` alone with every page resident, and
afterwards both tiers are empty and consistent."""
from __future__ import annotations

from dhs_server import as_cli_prints, assert_pool_clean, generate_alone

SERVER_POLICY = "coverage:0.99"
# (--kv-io-gbps 0.1: a slow link, an 8 KiB page 82 us at least, so the target sits inside its bounds
# [0.001, 0.1] for a CPU decode step of 10-500 ms reading ~2,000 pages)
SERVER_ARGS = ["--sparse-policy", SERVER_POLICY, "--cpu-kv-gb", "1", "--kv-device-budget", "auto", "--kv-budget-io-share",
               "0.05", "--kv-recall", "ahead", "--max-num-seqs", "4", "--kv-io-gbps", "0.1"]
PROMPT = ("The lock keeper counted every barge that passed gate 7. " * 60) + "\nThe last barge that passed was named"
MAX_TOKENS = 16
FIXED_TARGET = 0.025


def test_the_miss_target_follows_the_link(server):
    want = generate_alone(PROMPT, MAX_TOKENS, ignore_eos=True, args=["--sparse-policy", SERVER_POLICY])
    status, body = server.post_json("/v1/completions", {"prompt": PROMPT, "max_tokens": MAX_TOKENS,
                                                        "temperature": 0, "ignore_eos": True}, timeout=600)
    assert status == 200, body
    assert as_cli_prints(body["choices"][0]["text"]) == want
    m = server.wait_idle()
    target = m["dhisparse:kv_budget_target_miss"]
    assert 0.001 <= target <= 0.1 and abs(target - FIXED_TARGET) > 1e-6, target
    assert m["dhisparse:kv_tier_host_used_pages"] == 0
    assert_pool_clean(m)
