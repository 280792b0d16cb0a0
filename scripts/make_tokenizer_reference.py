#!/usr/bin/env python3
"""Builds the tokenizer test data in tests/data/tokenizer/ with Hugging Face `tokenizers`.

Two real reference tokenizers, each rebuilt here as a HF tokenizer.json from its
original vocabulary (no model hub is needed), and one small synthetic one:

  smollm2/  byte-level BPE of the default model, from the GGUF vocabulary and merges of
            models/SmolLM2-135M-Instruct.Q4_1.gguf, with the pre-tokenizer SmolLM2's own
            tokenizer.json uses (Digits(individual) then ByteLevel with the GPT-2 regex).
  mistral/  SentencePiece BPE with byte fallback: Mistral-7B v0.1's tokenizer.model, which
            the PyPI wheel mistral_common (Apache-2.0) ships as data/tokenizer.model.v1.
            Written both as a legacy-style Llama/Mistral tokenizer.json (Prepend + Replace
            normalizer, byte_fallback, merges ordered by score) and as a vocab-only GGUF
            (tokenizer.ggml.model = "llama", scores, token types).
  synthetic_llama3/  a few-token byte-level vocabulary in Llama-3's tokenizer.json layout
            (Split regex, ignore_merges, "a b" merges, TemplateProcessing BOS).

For every corpus string the reference files hold HF's ids with special tokens parsed
(`ids`) and with no special tokens registered (`ids_plain`: special-token text encoded as
plain text; non-special added tokens still match, as in Tokenizer::encode with
parse_special = false), and HF's decode of `ids` (`decoded`). For Mistral, `ids_metaspace` are the
ids of the same vocabulary laid out the newer way (Metaspace pre-tokenizer, prepend
scheme "first"; the C++ test rewrites tokenizer.json that way), and sentencepiece's own
ids are checked against HF's when the `sentencepiece` package is importable.

Usage: python3 scripts/make_tokenizer_reference.py [--model GGUF] [--spm-model FILE] [--out DIR]
Needs: tokenizers, gguf, numpy (pip); optional: sentencepiece.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import zipfile

import gguf
import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Varied on purpose: ASCII, CJK, emoji (incl. ZWJ sequences), whitespace runs with
# tabs/newlines/trailing spaces, digits and long numbers, code, accented Latin,
# contractions, chat special tokens, the empty string.
CORPUS = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "trailing space ",
    "trailing spaces   ",
    "  two leading spaces",
    "multiple    spaces   between     words",
    "tab\tseparated\tvalues",
    "\t\tleading tabs",
    "line one\nline two\n\nline four\n",
    "windows\r\nline\r\nendings",
    "\n\n\n",
    " ",
    "   ",
    "mixed \t \n whitespace\n \t",
    "123",
    "1234567890",
    "The year 2024 had 366 days and 8784 hours.",
    "pi = 3.14159265358979323846",
    "Call 555-0123 or +1 (800) 123-4567",
    "x1 y22 z333 w4444",
    "It's, they're, we've, I'm, you'll, he'd, IT'S, THEY'RE",
    "don't won't can't shouldn't",
    "Café, naïve, résumé, crème brûlée, Ångström, Ærø, façade",
    "Zoë Saldaña and Björk went to São Paulo.",
    "Straße und Größe über Äpfel",
    "Привет, мир! Как дела?",
    "Γειά σου Κόσμε",
    "こんにちは世界",
    "你好，世界！今天天气很好。",
    "한국어 텍스트입니다",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "Emoji: 🤖🚀✨ and 👍🏽 and 👨‍👩‍👧‍👦 family",
    "🎉",
    "😀😃😄😁😆",
    "def foo(x):\n    return x * 2  # double\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "#include <stdio.h>\nint main() { printf(\"%d\\n\", 42); }",
    "<html><body class=\"main\">Hi &amp; bye</body></html>",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "https://example.com/path?query=value&other=123#frag",
    "user@example.org wrote: >>> quoted",
    "!!!???...,,,;;;:::",
    "a_b-c.d/e\\f|g~h`i^j",
    "ALL CAPS SENTENCE HERE",
    "camelCaseIdentifier and snake_case_identifier",
    "Ünïcödé ñ ç ø å ß",
    "½ ¼ ² ³ ① Ⅻ",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>",
    "text before <|im_end|> text after",
    "<|endoftext|>",
    "<|im_start|><|im_end|>",
    "almost <|im_start special",
    "<s> Hello</s>",
    "[INST] What is 2+2? [/INST]",
    "<s>[INST] Hi [/INST] Hello</s>",
    "ending with newline\n",
    "Mixed 日本語 and English and 123 numbers 🎌",
]


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {os.path.relpath(path, ROOT)} ({os.path.getsize(path)} bytes)")


def gguf_field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def references(tok, tok_plain, corpus, extra=None):
    """Per string: ids (special tokens parsed), ids_plain (no added tokens), decoded
    (HF decode of ids, special tokens kept), and extra[name] ids from other tokenizers."""
    out = []
    for text in corpus:
        ids = tok.encode(text, add_special_tokens=False).ids
        case = {"text": text, "ids": ids,
                "ids_plain": tok_plain.encode(text, add_special_tokens=False).ids,
                "decoded": tok.decode(ids, skip_special_tokens=False)}
        for name, t in (extra or {}).items():
            case[name] = t.encode(text, add_special_tokens=False).ids
        out.append(case)
    return out


# ---- byte-level BPE: SmolLM2 from the GGUF -----------------------------------------

def smollm2_tokenizer(tokens, merges, specials, with_added):
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    if with_added:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


def build_smollm2(model_path, out_dir):
    r = gguf.GGUFReader(model_path)
    assert gguf_field(r, "tokenizer.ggml.model") == "gpt2"
    assert gguf_field(r, "tokenizer.ggml.pre") == "smollm"
    tokens = gguf_field(r, "tokenizer.ggml.tokens")
    merges = gguf_field(r, "tokenizer.ggml.merges")
    types = gguf_field(r, "tokenizer.ggml.token_type")
    specials = [t for t, ty in zip(tokens, types) if ty in (3, 4)]
    tok = smollm2_tokenizer(tokens, merges, specials, True)
    plain = smollm2_tokenizer(tokens, merges, specials, False)

    d = os.path.join(out_dir, "smollm2")
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
    print(f"wrote smollm2/tokenizer.json ({os.path.getsize(os.path.join(d, 'tokenizer.json'))} bytes)")
    bos = tokens[gguf_field(r, "tokenizer.ggml.bos_token_id")]
    eos = tokens[gguf_field(r, "tokenizer.ggml.eos_token_id")]
    write_json(os.path.join(d, "tokenizer_config.json"), {
        "add_bos_token": False, "bos_token": bos, "eos_token": eos,
        "chat_template": gguf_field(r, "tokenizer.chat_template"),
    })
    refs = references(tok, plain, CORPUS)
    write_json(os.path.join(d, "reference.json"), {
        "tokenizer": "SmolLM2-135M-Instruct (byte-level BPE, pre-tokenizer smollm)",
        "produced_by": f"tokenizers {__import__('tokenizers').__version__}",
        "cases": refs,
    })


# ---- byte-level BPE, Llama-3 layout: a tiny synthetic vocabulary ------------------

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def gpt2_byte_chars():
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


def build_synthetic_llama3(out_dir):
    """What Llama-3's tokenizer.json does, on a vocabulary small enough to read: a Split
    with the Llama-3 regex then ByteLevel without regex, ignore_merges (a word that is a
    vocabulary entry is taken whole: "abc" has no merge path), merges written as "a b"
    strings, a non-special added token, and a TemplateProcessing post-processor that
    puts <|begin_of_text|> first (so add_bos)."""
    chars = gpt2_byte_chars()
    vocab = {chars[b]: b for b in range(256)}
    for word in ["ab", "abc", "\u0120ab", "12", "123", "\u0120the", "he", "the"]:
        vocab[word] = len(vocab)
    bot, tool = len(vocab), len(vocab) + 1
    j = {
        "version": "1.0",
        "added_tokens": [
            {"id": bot, "content": "<|begin_of_text|>", "special": True, "single_word": False,
             "lstrip": False, "rstrip": False, "normalized": False},
            {"id": tool, "content": "<tool>", "special": False, "single_word": False,
             "lstrip": False, "rstrip": False, "normalized": False},
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [],
                           "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bot],
                                                                   "tokens": ["<|begin_of_text|>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": True, "vocab": vocab,
                  "merges": ["a b", "\u0120 ab", "1 2", "12 3", "h e", "t he", "\u0120 the"]},
    }
    d = os.path.join(out_dir, "synthetic_llama3")
    os.makedirs(d, exist_ok=True)
    write_json(os.path.join(d, "tokenizer.json"), j)
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    # Plain: special tokens become ordinary (unmergeable) vocabulary entries, ids unchanged.
    for t in j["added_tokens"]:
        if t["special"]:
            j["model"]["vocab"][t["content"]] = t["id"]
    j["added_tokens"] = [t for t in j["added_tokens"] if not t["special"]]
    plain = Tokenizer.from_str(json.dumps(j))
    corpus = ["abc ab abcd", "<tool>abc<|begin_of_text|> ab", "1234567 12", "the other theme",
              "I'M HERE\n\n  ok  ", "x<tool>y"] + CORPUS
    write_json(os.path.join(d, "reference.json"), {
        "tokenizer": "synthetic Llama-3-style byte-level BPE",
        "produced_by": f"tokenizers {__import__('tokenizers').__version__}",
        "cases": references(tok, plain, corpus),
    })


# ---- SentencePiece BPE: Mistral-7B v0.1 tokenizer.model -------------------------

# sentencepiece ModelProto.SentencePiece.Type
SP_NORMAL, SP_UNKNOWN, SP_CONTROL, SP_USER_DEFINED, SP_UNUSED, SP_BYTE = 1, 2, 3, 4, 5, 6


def read_varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, i


def proto_fields(b):
    """Yields (field_number, wire_type, value) of one protobuf message."""
    i = 0
    while i < len(b):
        key, i = read_varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(b, i)
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 2:
            n, i = read_varint(b, i)
            v, i = b[i:i + n], i + n
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported wire type {wt}")
        yield num, wt, v


def read_spm_model(path):
    """(pieces, scores, types, add_dummy_prefix) from a sentencepiece .model file."""
    data = open(path, "rb").read()
    pieces, scores, types = [], [], []
    add_dummy_prefix = True
    for num, _, v in proto_fields(data):
        if num == 1:  # repeated SentencePiece pieces
            piece, score, ty = "", 0.0, SP_NORMAL
            for n2, _, v2 in proto_fields(v):
                if n2 == 1:
                    piece = v2.decode("utf-8")
                elif n2 == 2:
                    score = struct.unpack("<f", v2)[0]
                elif n2 == 3:
                    ty = v2
            pieces.append(piece)
            scores.append(score)
            types.append(ty)
        elif num == 2:  # TrainerSpec
            for n2, _, v2 in proto_fields(v):
                if n2 == 3 and v2 != 2:  # model_type: 1 unigram, 2 BPE
                    raise ValueError("not a BPE sentencepiece model")
        elif num == 3:  # NormalizerSpec
            for n2, _, v2 in proto_fields(v):
                if n2 == 3:
                    add_dummy_prefix = bool(v2)
    return pieces, scores, types, add_dummy_prefix


def spm_merges(pieces, scores, types):
    """BPE merges equivalent to score-ordered SentencePiece merging: every split of a
    normal piece into two normal pieces, ranked by the merged piece's score (higher
    first), then by the merged piece's id."""
    vocab = {p: i for i, p in enumerate(pieces) if types[i] in (SP_NORMAL, SP_USER_DEFINED)}
    merges = []
    for merged, mid in vocab.items():
        for k in range(1, len(merged)):
            a, b = merged[:k], merged[k:]
            if a in vocab and b in vocab:
                merges.append((-scores[mid], mid, vocab[a], a, b))
    merges.sort()
    return [(a, b) for _, _, _, a, b in merges]


def mistral_tokenizer(pieces, scores, types, with_added, metaspace=False):
    """Legacy layout (Prepend + Replace normalizer) or, with metaspace, the newer one
    (no normalizer, Metaspace pre-tokenizer with prepend_scheme "first", no split)."""
    vocab = {p: i for i, p in enumerate(pieces)}
    unk = pieces[types.index(SP_UNKNOWN)]
    bpe = models.BPE(vocab=vocab, merges=spm_merges(pieces, scores, types), unk_token=unk,
                     fuse_unk=True, byte_fallback=True)
    tok = Tokenizer(bpe)
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    if with_added:
        tok.add_special_tokens([AddedToken(p, special=True, normalized=False)
                                for p, t in zip(pieces, types) if t in (SP_UNKNOWN, SP_CONTROL)])
    return tok


def fetch_mistral_model(tmp):
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", tmp,
                    "mistral_common==1.12.0"], check=True)
    whl = [f for f in os.listdir(tmp) if f.endswith(".whl")][0]
    with zipfile.ZipFile(os.path.join(tmp, whl)) as z:
        return z.extract("mistral_common/data/tokenizer.model.v1", tmp)


def build_mistral(spm_path, out_dir):
    pieces, scores, types, add_dummy_prefix = read_spm_model(spm_path)
    assert add_dummy_prefix
    tok = mistral_tokenizer(pieces, scores, types, True)
    plain = mistral_tokenizer(pieces, scores, types, False)

    d = os.path.join(out_dir, "mistral")
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
    print(f"wrote mistral/tokenizer.json ({os.path.getsize(os.path.join(d, 'tokenizer.json'))} bytes)")
    write_json(os.path.join(d, "tokenizer_config.json"), {
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>",
    })

    # Vocab-only GGUF, as llama.cpp's converter lays out a SentencePiece vocabulary.
    w = gguf.GGUFWriter(os.path.join(d, "vocab.gguf"), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores([float(s) for s in np.array(scores, dtype=np.float32)])
    w.add_token_types(types)
    w.add_bos_token_id(pieces.index("<s>"))
    w.add_eos_token_id(pieces.index("</s>"))
    w.add_unk_token_id(types.index(SP_UNKNOWN))
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote mistral/vocab.gguf ({os.path.getsize(os.path.join(d, 'vocab.gguf'))} bytes)")

    meta = mistral_tokenizer(pieces, scores, types, True, metaspace=True)
    refs = references(tok, plain, CORPUS, {"ids_metaspace": meta})
    try:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=spm_path)
        n_checked = 0
        for case in refs:
            if "<s>" in case["text"] or "</s>" in case["text"] or "<unk>" in case["text"]:
                continue
            assert sp.encode(case["text"]) == case["ids_plain"], case["text"]
            n_checked += 1
        print(f"sentencepiece agrees with HF on {n_checked} strings")
    except ImportError:
        print("sentencepiece not installed: skipped the cross-check")
    write_json(os.path.join(d, "reference.json"), {
        "tokenizer": "Mistral-7B v0.1 tokenizer.model (SentencePiece BPE, byte fallback)",
        "produced_by": f"tokenizers {__import__('tokenizers').__version__}",
        "cases": refs,
    })


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--spm-model", help="Mistral tokenizer.model (default: from the mistral_common wheel)")
    ap.add_argument("--out", default=os.path.join(ROOT, "tests/data/tokenizer"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    build_smollm2(args.model, args.out)
    build_synthetic_llama3(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        build_mistral(args.spm_model or fetch_mistral_model(tmp), args.out)


if __name__ == "__main__":
    main()
