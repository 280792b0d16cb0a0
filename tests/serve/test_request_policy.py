"""A request's own sparse policy (`sparse_policy`, dhisparse's extension field) against a server
started with a sparse policy: each request's greedy text equals `dhisparse generate` run alone
with that policy; what a request may not choose is a 400 that says why. (Requests under different
policies in one decode step: tests/unit/test_request_policy.cpp, logits against each alone. Here
they run one after another: a decode row that shares its step with another request's prefill
chunk reads every page, so concurrent texts depend on arrival timing.)"""
from __future__ import annotations

import concurrent.futures as cf

import pytest

from dhs_server import as_cli_prints, assert_pool_clean, generate_alone

SERVER_POLICY = "coverage:0.9"
SERVER_ARGS = ["--sparse-policy", SERVER_POLICY, "--max-num-seqs", "4"]
# ~700 tokens (44 pages of 16 per KV head): enough pages that the policies read different sets.
PROMPT = ("The old lighthouse keeper kept a log of every ship that passed the point. " * 40
          + "\nThe last ship in the log was named")
MAX_TOKENS = 24
# (the request's sparse_policy, what generate is told): None = the server's own.
POLICIES = [("dense", []), (None, ["--sparse-policy", SERVER_POLICY]), ("sinkwindow:4", ["--sparse-policy", "sinkwindow:4"]),
            ("topk:6", ["--sparse-policy", "topk:6"])]


def complete(server, policy, **extra):
    body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, **extra}
    if policy is not None:
        body["sparse_policy"] = policy
    return server.post_json("/v1/completions", body, timeout=600)


def test_each_request_gets_its_policy(server):
    want = {p: generate_alone(PROMPT, MAX_TOKENS, ignore_eos=True, args=a) for p, a in POLICIES}
    assert len(set(want.values())) >= 2, f"every policy gave the same text here: the check is void ({want})"
    for p, _ in POLICIES:
        status, body = complete(server, p)
        assert status == 200, (p, body)
        assert as_cli_prints(body["choices"][0]["text"]) == want[p], f"sparse_policy {p!r}"
    assert_pool_clean(server.wait_idle())


def test_policies_together_all_answer(server):
    with cf.ThreadPoolExecutor(len(POLICIES)) as ex:
        got = list(ex.map(lambda pa: complete(server, pa[0]), POLICIES))
    for (p, _), (status, body) in zip(POLICIES, got):
        assert status == 200, (p, body)
        assert body["usage"]["completion_tokens"] == MAX_TOKENS, (p, body)
    assert_pool_clean(server.wait_idle())


@pytest.mark.parametrize("policy,why", [
    ("coverage:0.9@minmax", "estimator"),
    ("coverage:0.9/2", "reselect"),
    ("solohead:0.9", "solohead"),
    ("coverage:2", "mass"),
    ("nonsense", "nonsense"),
])
def test_what_a_request_may_not_choose_is_400(server, policy, why):
    status, body = complete(server, policy)
    assert status == 400, body
    err = body["error"]
    assert err["type"] == "invalid_request_error", err
    assert why in err["message"].lower(), err["message"]
    status, body = server.post_json("/v1/completions", {"prompt": "Hi", "max_tokens": 1, "sparse_policy": 5})
    assert status == 400 and body["error"]["param"] == "sparse_policy", body
