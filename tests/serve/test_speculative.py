"""Speculative decoding through the server (`--speculative-k`, and dhisparse's request field
`speculative_k`): a greedy request's text equals `dhisparse generate` alone without speculation,
whether the server's k, the request's own k or k = 0 runs it; sampled requests speculate too (their
distribution is the unit test's matter); the counters in /metrics move and the pool is clean. Requests run one after another: on a sparse server a decode row that shares its step with
another request's prefill chunk reads every page (test_request_policy.py says more)."""
from __future__ import annotations

import pytest

from dhs_server import as_cli_prints, assert_pool_clean, generate_alone

SERVER_POLICY = "coverage:0.9"
SERVER_ARGS = ["--sparse-policy", SERVER_POLICY, "--speculative-k", "4", "--draft-policy", "sinkwindow:2",
               "--max-num-seqs", "4"]
# ~700 tokens (44 pages of 16 per KV head): a draft of 2 pages guesses some tokens wrong.
PROMPT = ("The old lighthouse keeper kept a log of every ship that passed the point. " * 40
          + "\nThe last ship in the log was named")
MAX_TOKENS = 24


def complete(server, **extra):
    body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, **extra}
    return server.post_json("/v1/completions", body, timeout=600)


def test_greedy_text_equals_decoding_without_speculation(server):
    want = generate_alone(PROMPT, MAX_TOKENS, ignore_eos=True, args=["--sparse-policy", SERVER_POLICY])
    m0 = server.metrics()
    # ("auto" is accepted; on the CPU backend it never drafts: each verify row reads its KV itself.)
    for extra in ({}, {"speculative_k": 2}, {"speculative_k": 7}, {"speculative_k": 0}, {"speculative_k": "auto"}):
        status, body = complete(server, **extra)
        assert status == 200, (extra, body)
        assert as_cli_prints(body["choices"][0]["text"]) == want, f"request fields {extra}"
        assert body["usage"]["completion_tokens"] == MAX_TOKENS
    m = server.wait_idle()
    drafts = m["vllm:spec_decode_num_drafts_total"] - m0.get("vllm:spec_decode_num_drafts_total", 0)
    drafted = m["vllm:spec_decode_num_draft_tokens_total"] - m0.get("vllm:spec_decode_num_draft_tokens_total", 0)
    accepted = m["vllm:spec_decode_num_accepted_tokens_total"] - m0.get("vllm:spec_decode_num_accepted_tokens_total", 0)
    assert drafts > 0 and 0 < accepted < drafted, (drafts, drafted, accepted)
    assert_pool_clean(m)


def test_sampled_requests_speculate_too(server):
    # A sampled request under speculation draws from the same distribution as without it (the
    # acceptance rule: tests/unit/test_spec_accept.cpp), not the same sequence for a seed; with
    # speculative_k 0 it is the same sequence as generate alone.
    sampling = {"temperature": 0.8, "seed": 7}
    want = generate_alone(PROMPT, 8, ignore_eos=True, sampling=sampling, args=["--sparse-policy", SERVER_POLICY])
    status, body = complete(server, max_tokens=8, speculative_k=0, **sampling)
    assert status == 200, body
    assert as_cli_prints(body["choices"][0]["text"]) == want
    m0 = server.metrics()
    status, body = complete(server, max_tokens=16, **sampling)
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 16
    m = server.wait_idle()
    assert m["vllm:spec_decode_num_drafts_total"] > m0["vllm:spec_decode_num_drafts_total"]
    assert_pool_clean(m)


@pytest.mark.parametrize("extra,why", [
    ({"speculative_k": 17}, "speculative_k"),
    ({"speculative_k": "four"}, "speculative_k"),
])
def test_bad_speculation_is_400(server, extra, why):
    status, body = complete(server, **extra)
    assert status == 400, body
    assert why in body["error"]["message"], body
