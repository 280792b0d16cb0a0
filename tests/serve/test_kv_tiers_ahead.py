"""The KV hierarchy's recall-ahead schedule through the server (`--kv-recall ahead`, the GPU's
schedule; docs/hierarchy.md "Recall ahead"): with a device budget of about one layer's pages per
request, each decode step reads most pages in place from the host tier and merges them by
log-sum-exp, and pages come back between steps; a greedy request's text still equals
`dhisparse generate` alone with every page resident; /metrics counts the late reads and the moves,
and afterwards both tiers are empty and consistent."""
from __future__ import annotations

from dhs_server import as_cli_prints, assert_pool_clean, generate_alone

SERVER_POLICY = "coverage:0.99"
# ~700 tokens: 44 pages per (layer, KV head); 3 KV heads: one layer's pages are ~132.
# (--kv-io-gbps 10: an 8 KiB page's bytes cost 0.82 us on the link, the least its measured price may be)
SERVER_ARGS = ["--sparse-policy", SERVER_POLICY, "--cpu-kv-gb", "1", "--kv-device-budget", "140", "--kv-recall", "ahead",
               "--max-num-seqs", "4", "--kv-io-gbps", "10"]
PAGE_LINK_US = 2 * 16 * 64 * 4 / 10e9 * 1e6  # K and V, 16 tokens x 64 dims x 4 bytes (the CPU backend's f32 pages), at 10 GB/s
PROMPTS = [("The lighthouse keeper logged every ship that passed cape " + str(i) + ". " * 1) * 60
           + "\nThe last ship that passed was named" for i in range(2)]
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
    late = m["dhisparse:kv_tier_late_total"] - m0.get("dhisparse:kv_tier_late_total", 0)
    offloaded = m["dhisparse:kv_tier_offloaded_total"] - m0.get("dhisparse:kv_tier_offloaded_total", 0)
    assert late > 0 and offloaded > 0, (late, offloaded)
    # IO-aware admission's price of a moved page (kv/io_cost.h): at least its bytes at the link's rate.
    assert PAGE_LINK_US * (1 - 1e-6) <= m["dhisparse:kv_page_cost_us"] < 1e6, m["dhisparse:kv_page_cost_us"]
    assert m["dhisparse:kv_tier_host_used_pages"] == 0
    # The overlapped landing's counters (CUDA; this server runs on the CPU, which has no second stream).
    assert m["dhisparse:kv_tier_steps_total"] == 0 and m["dhisparse:kv_land_overlapped_steps_total"] == 0
    assert_pool_clean(m)
