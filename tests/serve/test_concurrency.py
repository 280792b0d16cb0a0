"""Many requests at once (openai.AsyncOpenAI): 64 concurrent requests with different prompts,
lengths, sampling parameters and stop strings, streamed and not, all finish; every greedy one
returns exactly what `dhisparse generate` returns for it alone (batching must not change results
on the CPU). Then a server with a deliberately tiny KV pool: requests get preempted and resume
with the same greedy text, and the pool is empty afterwards."""
from __future__ import annotations

import asyncio
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import openai
import pytest

from dhs_server import Server, as_cli_prints, assert_pool_clean, device_args, generate_alone

pytestmark = pytest.mark.concurrency

# Equal tokens alone and batched is the CPU backend's property (one canonical dot per row,
# test_batch_invariance). The CUDA kernels are not batch-invariant: the split-KV plan, the GEMV's
# row tiles and cuBLASLt's algorithm depend on the batch, and a recomputed prompt runs the prefill
# kernels instead of decode, so bf16 near-ties of a small model can flip (4 of 48 greedy requests,
# 7 of 16 seeded sampled and 5 of 8 preempted on the H200 at dd2031a; docs/serving.md).
batch_invariant = pytest.mark.xfail("cuda" in device_args(), strict=False,
                                    reason="CUDA kernels are not batch-invariant (docs/serving.md)")

SUBJECTS = ["the sea", "a red bicycle", "prime numbers", "the moon", "bread", "a small dog", "rain in April",
            "the French revolution", "volcanoes", "a library at night", "chess", "honey bees", "the color blue",
            "trains", "a lighthouse", "winter", "coffee", "an old clock", "mountains", "the internet",
            "penguins", "a violin", "gardening", "thunderstorms", "the number seven", "a desert", "paper",
            "bridges", "owls", "the alphabet", "snow", "rivers"]
STOPS = [".", "\n", " the", ",", "!"]


@dataclass
class Case:
    idx: int
    chat: bool
    stream: bool
    prompt: str
    max_tokens: int
    sampling: dict = field(default_factory=dict)  # empty: greedy
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    text: str | None = None
    finish: str | None = None
    n_out: int | None = None

    @property
    def greedy(self) -> bool:
        return not self.sampling


def make_cases(n: int, seed: int) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        subject = SUBJECTS[i % len(SUBJECTS)]
        chat = i % 2 == 0
        prompt = (f"Write two sentences about {subject}." if chat
                  else f"Here is a short story about {subject}. Once upon a time,")
        if i >= len(SUBJECTS):
            prompt = prompt.replace("two sentences", "a haiku") if chat else prompt.replace("short story", "fact")
        c = Case(i, chat, stream=rng.random() < 0.5, prompt=prompt, max_tokens=rng.choice([1, 3, 8, 17, 32, 48]))
        kind = i % 4
        if kind == 2:  # sampled, seeded
            c.sampling = {"temperature": rng.choice([0.5, 0.8, 1.2]), "top_p": rng.choice([0.9, 1.0]),
                          "top_k": rng.choice([0, 20, 50]), "seed": rng.randrange(1, 2**31)}
        if kind == 3 or rng.random() < 0.2:
            c.stop = rng.sample(STOPS, rng.choice([1, 2]))
        c.ignore_eos = rng.random() < 0.25
        cases.append(c)
    return cases


async def run_case(client: openai.AsyncOpenAI, c: Case) -> None:
    kw = dict(max_tokens=c.max_tokens, temperature=0.0, extra_body={"ignore_eos": c.ignore_eos})
    if c.sampling:
        kw.update({k: v for k, v in c.sampling.items() if k in ("temperature", "top_p", "seed")})
        kw["extra_body"]["top_k"] = c.sampling["top_k"]
    if c.stop:
        kw["stop"] = c.stop
    if c.chat:
        msgs = [{"role": "user", "content": c.prompt}]
        if c.stream:
            parts, finish, usage = [], None, None
            async for ch in await client.chat.completions.create(model="", messages=msgs, stream=True,
                                                                 stream_options={"include_usage": True}, **kw):
                if ch.choices:
                    parts.append(ch.choices[0].delta.content or "")
                    finish = ch.choices[0].finish_reason or finish
                if ch.usage:
                    usage = ch.usage
            c.text, c.finish, c.n_out = "".join(parts), finish, usage.completion_tokens
        else:
            r = await client.chat.completions.create(model="", messages=msgs, **kw)
            c.text, c.finish, c.n_out = r.choices[0].message.content, r.choices[0].finish_reason, \
                r.usage.completion_tokens
    else:
        if c.stream:
            parts, finish, usage = [], None, None
            async for ch in await client.completions.create(model="", prompt=c.prompt, stream=True,
                                                            stream_options={"include_usage": True}, **kw):
                if ch.choices:
                    parts.append(ch.choices[0].text)
                    finish = ch.choices[0].finish_reason or finish
                if ch.usage:
                    usage = ch.usage
            c.text, c.finish, c.n_out = "".join(parts), finish, usage.completion_tokens
        else:
            r = await client.completions.create(model="", prompt=c.prompt, **kw)
            c.text, c.finish, c.n_out = r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens


async def run_all(server: Server, cases: list[Case], timeout_s: float) -> None:
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=timeout_s)
    try:
        await asyncio.wait_for(asyncio.gather(*(run_case(client, c) for c in cases)), timeout_s)
    finally:
        await client.close()


def alone_outputs(cases: list[Case], sampled_too: bool) -> dict[int, str]:
    todo = [c for c in cases if c.greedy or sampled_too]
    with ThreadPoolExecutor(2) as pool:
        futs = {c.idx: pool.submit(generate_alone, c.prompt, c.max_tokens, chat=c.chat, stop=c.stop,
                                   ignore_eos=c.ignore_eos, sampling=c.sampling) for c in todo}
        return {i: f.result() for i, f in futs.items()}


def check_finished(cases: list[Case]) -> None:
    for c in cases:
        assert c.text is not None and c.finish in ("stop", "length"), (c.idx, c.finish, c.text)
        assert 0 <= c.n_out <= c.max_tokens, (c.idx, c.n_out, c.max_tokens)
        if c.finish == "length":
            assert c.n_out == c.max_tokens, (c.idx, c.n_out, c.max_tokens)
        for s in c.stop:
            assert s not in c.text, (c.idx, s, c.text)


def mismatches(cases: list[Case], alone: dict[int, str], greedy_only: bool = True) -> list[str]:
    out = []
    for c in cases:
        if c.idx not in alone or (greedy_only and not c.greedy):
            continue
        if as_cli_prints(c.text) != alone[c.idx]:
            out.append(f"case {c.idx} ({'chat' if c.chat else 'completion'}, stream={c.stream}, "
                       f"max_tokens={c.max_tokens}, stop={c.stop!r}, ignore_eos={c.ignore_eos}, "
                       f"sampling={c.sampling}, prompt={c.prompt!r}):\n  served: {c.text!r}\n  alone:  "
                       f"{alone[c.idx].removesuffix(chr(10))!r}")
    return out


@pytest.fixture(scope="module")
def batch64(server):
    """The 64 requests, run once at the same time; their outputs, and generate's for each alone."""
    cases = make_cases(64, seed=21)
    t0 = time.monotonic()
    asyncio.run(run_all(server, cases, timeout_s=300))
    t1 = time.monotonic()
    alone = alone_outputs(cases, sampled_too=True)
    print(f"\n64 requests served in {t1 - t0:.1f} s; generate alone for each in {time.monotonic() - t1:.1f} s")
    return cases, alone


def test_64_concurrent_requests_finish(batch64, server):
    cases, _ = batch64
    check_finished(cases)
    assert_pool_clean(server.wait_idle())


@batch_invariant
def test_64_concurrent_greedy_equal_generate_alone(batch64):
    cases, alone = batch64
    bad = mismatches(cases, alone)
    n_greedy = sum(c.greedy for c in cases)
    assert not bad, f"{len(bad)} of {n_greedy} greedy requests differ from generate alone:\n" + "\n".join(bad)


@batch_invariant
def test_64_concurrent_seeded_sampling_equal_generate_alone(batch64):
    # Each request has its own seeded RNG (issue 21), so a seeded sampled request in a batch of
    # 64 gives what `generate --seed` gives alone.
    cases, alone = batch64
    sampled = [c for c in cases if not c.greedy]
    bad = mismatches(sampled, alone, greedy_only=False)
    assert not bad, f"{len(bad)} of {len(sampled)} seeded sampled requests differ from generate alone:\n" + \
        "\n".join(bad)


# --- preemption under a tiny KV pool ------------------------------------------------------------
# 24 blocks of 16 tokens (per layer and KV head) hold 384 tokens in all; 8 requests of ~40 prompt
# tokens + 64 generated (~104 each, 832 in all) cannot all fit, so decode runs the pool dry.
TINY_POOL_BLOCKS = 24


@pytest.mark.preemption
@batch_invariant
def test_preemption_resumes_with_same_greedy_text():
    cases = []
    for i, subject in enumerate(SUBJECTS[:8]):
        cases.append(Case(i, chat=i % 2 == 0, stream=i % 3 == 0,
                          prompt=f"Tell me everything you know about {subject}, in detail, please.",
                          max_tokens=64, ignore_eos=True))
    with Server(["--num-gpu-blocks-override", str(TINY_POOL_BLOCKS)], name="preempt") as srv:
        m0 = srv.metrics()
        asyncio.run(run_all(srv, cases, timeout_s=300))
        check_finished(cases)
        m = srv.wait_idle()
        assert m["vllm:num_preemptions_total"] > 0, \
            f"no preemption with a pool of {m0['dhisparse:kv_pool_total_blocks']:.0f} blocks"
        assert_pool_clean(m)
        alone = alone_outputs(cases, sampled_too=False)
        bad = mismatches(cases, alone)
        assert not bad, f"{len(bad)} of 8 preempted greedy requests differ from generate alone:\n" + "\n".join(bad)
        print(f"preemptions: {m['vllm:num_preemptions_total']:.0f}")
