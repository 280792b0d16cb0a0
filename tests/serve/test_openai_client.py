"""The official `openai` client against `dhisparse serve`: completions and chat, whole and streamed,
usage, finish reasons, stop strings, include_usage, /v1/models, seeds, unsupported fields."""
from __future__ import annotations

import openai
import pytest

from dhs_server import as_cli_prints, assert_pool_clean, generate_alone

pytestmark = pytest.mark.openai_client

MODEL_NAME = "smol-e2e"
SERVER_ARGS = ["--served-model-name", MODEL_NAME]
PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def client(server):
    c = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
    yield c
    c.close()


def test_models_lists_the_served_name(client, server):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == [MODEL_NAME]
    assert models.data[0].object == "model"


def test_completion_whole_greedy_matches_generate(client):
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0)
    assert r.object == "text_completion"
    assert r.model == MODEL_NAME
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0
    assert r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert as_cli_prints(c.text) == generate_alone(PROMPT, 24)


def test_chat_whole_greedy_matches_generate(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=24, temperature=0)
    assert r.object == "chat.completion"
    m = r.choices[0].message
    assert m.role == "assistant"
    assert isinstance(m.content, str) and m.content
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert as_cli_prints(m.content) == generate_alone(CHAT[0]["content"], 24, chat=True)


def test_model_may_be_left_out_or_must_match(client):
    r = client.completions.create(model="", prompt=PROMPT, max_tokens=2, temperature=0)
    assert r.choices[0].text
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=2)


def test_finish_reason_length_at_max_tokens(client):
    for n in (1, 7):
        r = client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=n, temperature=0,
                                      extra_body={"ignore_eos": True})
        assert r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == n
    r = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_completion_tokens=5, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5


def test_stop_string_ends_the_text_before_it(client):
    full = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=32, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    words = full.split()
    assert len(words) >= 3, full
    stop = words[len(words) // 2]
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=32, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True})
    c = r.choices[0]
    assert c.finish_reason == "stop"
    assert stop not in c.text
    assert c.text == full[: full.index(stop)], (stop, full, c.text)
    # The CLI's --stop gives the same text.
    assert as_cli_prints(c.text) == generate_alone(PROMPT, 32, stop=[stop], ignore_eos=True)


def test_stream_completion_equals_whole(client):
    whole = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=20, temperature=0)
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=20, temperature=0,
                                            stream=True))
    assert chunks, "no chunks"
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices[0].finish_reason is not None
    assert all(c.usage is None for c in chunks), "usage chunk without include_usage"


def test_stream_chat_role_first_and_include_usage(client):
    whole = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=20, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=20, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    ids = {c.id for c in chunks}
    assert len(ids) == 1, ids
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    # The last chunk carries usage and no choices; the ones before carry usage null.
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.total_tokens == whole.usage.total_tokens
    assert all(c.usage is None for c in chunks[:-1])
    finishes = [c.choices[0].finish_reason for c in chunks[:-1] if c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]


def test_stream_completion_include_usage(client):
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 6


def test_seed_repeats_sampled_output(client):
    def sample(seed):
        return client.completions.create(model=MODEL_NAME, prompt="Write a word:", max_tokens=16, temperature=1.0,
                                         top_p=0.95, seed=seed, extra_body={"ignore_eos": True}).choices[0].text

    a, b = sample(1234), sample(1234)
    assert a == b
    others = {sample(s) for s in (1, 2, 3)}
    assert len(others | {a}) > 1, "four seeds gave the same sampled text"
    chat = [client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=12, temperature=0.8,
                                           seed=77).choices[0].message.content for _ in range(2)]
    assert chat[0] == chat[1]


def test_system_message_and_multiturn(client):
    msgs = [{"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Capital of Italy?"},
            {"role": "assistant", "content": "Rome."},
            {"role": "user", "content": "And of Spain?"}]
    r = client.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=8, temperature=0)
    assert r.choices[0].message.content is not None
    assert r.usage.prompt_tokens > 20


def test_unsupported_fields_are_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=2, n=2)
    assert e.value.status_code == 400
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=2, presence_penalty=0.5)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=10**9)


def test_request_policy_on_a_dense_server(client):
    # This server runs dense and keeps no page data: a request may ask for dense, nothing that selects.
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=4, temperature=0,
                                  extra_body={"sparse_policy": "dense"})
    assert r.usage.completion_tokens >= 1
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=4,
                                  extra_body={"sparse_policy": "coverage:0.9"})
    assert "dense" in str(e.value)


def test_token_id_prompt(client, server):
    status, tok = server.post_json("/tokenize", {"prompt": PROMPT})
    assert status == 200, tok
    ids = tok["tokens"]
    a = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=8, temperature=0)
    b = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=8, temperature=0)
    assert a.choices[0].text == b.choices[0].text
    assert a.usage.prompt_tokens == len(ids)


def test_pool_clean_after_module(client, server):
    assert_pool_clean(server.wait_idle())


def _chunk_times(client, **extra):
    import time
    t0 = time.perf_counter()
    times = []
    for ch in client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=24, temperature=0,
                                        stream=True, extra_body={"ignore_eos": True}, **extra):
        if ch.choices and ch.choices[0].text:
            times.append(time.perf_counter() - t0)
    return times


def test_stream_arrives_incrementally_uncompressed(client):
    # The first token must reach the client well before the last (24 decode steps apart).
    times = _chunk_times(client, extra_headers={"Accept-Encoding": "identity"})
    assert len(times) >= 2
    assert times[0] < 0.6 * times[-1], f"first token at {times[0]:.3f} s, last at {times[-1]:.3f} s"


def test_stream_arrives_incrementally_with_default_headers(client):
    times = _chunk_times(client)
    assert len(times) >= 2
    assert times[0] < 0.6 * times[-1], f"first token at {times[0]:.3f} s, last at {times[-1]:.3f} s"
