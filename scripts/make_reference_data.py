#!/usr/bin/env python3
"""Writes tests/data/reference/smollm2_135m.json: golden next-token logits and
greedy continuations for dhisparse's default model, computed by the independent
NumPy reference in scripts/reference_forward.py.

Usage (from the repository root):
  python3 scripts/make_reference_data.py                  # write the JSON
  python3 scripts/make_reference_data.py --dump-layer0 0  # layer-0 intermediates of
                                                          # prompt 0 -> /tmp/*.npz (debug only)
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_forward as rf  # noqa: E402

SCRIPT_VERSION = "1.0.0"
N_GREEDY = 40
TOP_K = 20


def long_text(tok, min_tokens: int = 1100) -> str:
    """Deterministic, varied, somewhat repetitive English text of >= min_tokens
    tokens (a fixed LCG picks the words; no dependence on Python's `random`)."""
    subjects = ["The old lighthouse keeper", "A young engineer", "The village baker", "Our neighbour's cat",
                "The river", "A travelling musician", "The school teacher", "The small robot",
                "An astronomer", "The harbour master", "A curious child", "The librarian"]
    verbs = ["watched", "repaired", "painted", "counted", "remembered", "followed", "described",
             "carried", "measured", "visited", "discovered", "ignored"]
    objects = ["the northern lights", "a broken clock", "seven wooden boats", "the morning fog",
               "an old map of the coast", "the quiet market square", "a letter from 1923",
               "the copper kettle", "twelve red apples", "the winding mountain road",
               "a field of sunflowers", "the last train home"]
    tails = ["before the sun went down.", "while the rain kept falling.", "and then wrote it all down.",
             "with great patience.", "for the third time that week.", "without saying a word.",
             "as the bells rang at noon.", "because nobody else would.", "in the spring of that year.",
             "and smiled quietly."]
    state = 20240607
    out = []
    para = []
    i = 0
    while True:
        picks = []
        for n in (len(subjects), len(verbs), len(objects), len(tails)):
            state = (1103515245 * state + 12345) % (1 << 31)
            picks.append((state >> 8) % n)
        s = f"{subjects[picks[0]]} {verbs[picks[1]]} {objects[picks[2]]} {tails[picks[3]]}"
        para.append(s)
        i += 1
        if i % 6 == 0:
            out.append(" ".join(para))
            para = []
            text = "\n\n".join(out)
            if len(tok.encode(text, add_special_tokens=False).ids) >= min_tokens:
                return text + "\n\nIn the end, the story was"


def prompts(tok):
    return [
        {"name": "chat_capital_france", "kind": "chat",
         "user_message": "What is the capital of France?",
         "text": rf.chat_prompt("What is the capital of France?")},
        {"name": "plain_continuation", "kind": "text",
         "text": "Once upon a time, in a small village nestled between two mountains, there lived a"},
        {"name": "code_python", "kind": "code",
         "text": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:"},
        {"name": "multilingual", "kind": "multilingual",
         "text": "Bonjour ! Je m'appelle Marie et j'habite à Paris. Über den Wolken muss die Freiheit "
                 "wohl grenzenlos sein. 東京は日本の首都です。 In English: the capital of Japan is"},
        {"name": "numbers", "kind": "numbers",
         "text": "The first prime numbers are 2, 3, 5, 7, 11, 13, 17, and 1234 + 4321 = 5555. Next primes: 19,"},
        {"name": "chat_haiku", "kind": "chat",
         "user_message": "Write a short poem about the sea.",
         "text": rf.chat_prompt("Write a short poem about the sea.")},
        {"name": "long_story", "kind": "long", "text": long_text(tok)},
    ]


def b64_f32(x: np.ndarray) -> str:
    return base64.b64encode(np.asarray(x, dtype="<f4").tobytes()).decode("ascii")


def top_k(logits: np.ndarray, k: int):
    order = np.argsort(-logits, kind="stable")[:k]
    return [[int(i), float(np.float32(logits[i]))] for i in order]


def dump_layer0(model, tok, plist, idx: int, out_dir: str = "/tmp"):
    p = plist[idx]
    ids = rf.encode(tok, model.cfg, p["text"])
    model.reset()
    d = {}
    model.forward(ids, dump=d)
    D = model.cfg.head_dim
    for name in ("l0_q_pre_rope", "l0_q_rope", "l0_k_pre_rope", "l0_k_rope"):
        x = d[name]  # HF layout -> GGUF/llama.cpp layout (rows 2j, 2j+1 = HF rows j, j + D/2)
        d[name + "_gguf_layout"] = x.reshape(x.shape[0], -1, 2, D // 2).swapaxes(2, 3).reshape(x.shape)
    path = os.path.join(out_dir, f"smollm2_135m_ref_layer0_p{idx}.npz")
    arrs = {k: (np.asarray(v, dtype=np.float32) if np.issubdtype(np.asarray(v).dtype, np.floating) else np.asarray(v))
            for k, v in d.items()}
    np.savez(path, **arrs)
    print(f"wrote {path}: prompt {idx} ({p['name']}, {len(ids)} tokens)")
    for k, v in arrs.items():
        print(f"  {k:24s} {str(v.shape):16s} {v.dtype}")
    print("layouts: [T, n_head*head_dim] with q/k rows in HF order (rotate_half pairs i, i+32); "
          "GGUF/llama.cpp-layout tensors have pairs (2j, 2j+1) per head instead.")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="tests/data/reference/smollm2_135m.json")
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--dump-layer0", type=int, default=None, metavar="PROMPT_IDX",
                    help="write layer-0 intermediates + final hidden state of this prompt to /tmp/*.npz and exit")
    args = ap.parse_args()

    t_start = time.time()
    model = rf.ReferenceModel(args.model, dtype=np.dtype(args.dtype).type)
    tok = rf.build_tokenizer(model.reader)
    cfg = model.cfg
    plist = prompts(tok)

    if args.dump_layer0 is not None:
        dump_layer0(model, tok, plist, args.dump_layer0)
        return

    print("hashing model ...", file=sys.stderr)
    sha = rf.sha256_file(args.model)
    records = []
    for i, p in enumerate(plist):
        t0 = time.time()
        ids = rf.encode(tok, cfg, p["text"])
        assert tok.decode(ids, skip_special_tokens=False) == p["text"], "tokenizer round trip failed"
        last, gen, gaps, second = model.greedy(ids, N_GREEDY)
        rec = dict(p)
        rec.update({
            "index": i,
            "n_prompt_tokens": len(ids),
            "prompt_ids": [int(x) for x in ids],
            "top20_last": top_k(last, TOP_K),
            "argmax_last": int(np.argmax(last)),
            "logits_last_b64_f32le": b64_f32(last),
            "greedy_ids": gen,
            "greedy_top2_gap": [round(g, 6) for g in gaps],
            "greedy_runner_up_ids": second,
            "greedy_text": tok.decode(gen, skip_special_tokens=False),
        })
        assert rec["greedy_ids"][0] == rec["argmax_last"]
        records.append(rec)
        print(f"[{i}] {p['name']:20s} {len(ids):5d} tok  {time.time() - t0:5.1f}s  "
              f"min gap {min(gaps):.4f}  -> {rec['greedy_text'][:80]!r}", file=sys.stderr)

    doc = {
        "format": "dhisparse-reference-logits",
        "script_version": SCRIPT_VERSION,
        "reference_forward_version": rf.REFERENCE_VERSION,
        "generator": "scripts/make_reference_data.py (NumPy reference, scripts/reference_forward.py)",
        "model_file": os.path.basename(args.model),
        "model_sha256": sha,
        "compute_dtype": args.dtype,
        "config": cfg.as_dict(),
        "n_vocab": model.n_vocab,
        "tokenizer": {
            "implementation": "HF tokenizers (BPE from GGUF tokens/merges; pre_tokenizer Sequence[Digits("
                              "individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)]; "
                              "token_type==3 tokens added as special tokens)",
            "add_bos_token": cfg.add_bos,
            "bos_token_id": cfg.bos_id,
            "eos_token_id": cfg.eos_id,
            "special_tokens_parsed_in_prompt_text": True,
        },
        "chat_template_rendering": "<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by "
                                   "Hugging Face<|im_end|>\\n<|im_start|>user\\n{user}<|im_end|>\\n"
                                   "<|im_start|>assistant\\n",
        "notes": [
            "logits_last_b64_f32le: base64 of n_vocab little-endian float32 logits at the last prompt position "
            "(computed in compute_dtype, rounded to float32).",
            "top20_last: [id, logit] sorted by descending logit; greedy_ids[0] == argmax of logits_last.",
            "greedy_ids: 40 greedy tokens with a KV cache; generation does NOT stop at EOS/<|im_end|>.",
            "greedy_top2_gap[j]: top1 - top2 logit at the step that produced greedy_ids[j]; a small gap "
            "explains a legitimate divergence of an engine with different rounding.",
            "The prompt ids never start with BOS: tokenizer.ggml.add_bos_token is false in this GGUF.",
        ],
        "prompts": records,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, ensure_ascii=False, indent=1)
        fh.write("\n")
    print(f"wrote {args.out} ({os.path.getsize(args.out) / 1e6:.2f} MB) in {time.time() - t_start:.1f}s",
          file=sys.stderr)


if __name__ == "__main__":
    main()
