#!/usr/bin/env python3
"""Independent NumPy reference forward pass for llama-architecture GGUF models
(written for dhisparse's default model, SmolLM2-135M-Instruct Q4_1).

Written from the Hugging Face Llama definition (LlamaForCausalLM):
  h = embed(ids)
  for each layer:
      x = rmsnorm(h) * attn_norm
      q, k, v = x Wq^T, x Wk^T, x Wv^T           (no biases)
      q, k = rope_rotate_half(q), rope_rotate_half(k)   (pairs i, i + d/2)
      a = softmax(q k^T / sqrt(d) + causal) v     (GQA: q head h uses kv head h // n_rep)
      h = h + a Wo^T
      x = rmsnorm(h) * ffn_norm
      h = h + (silu(x Wg^T) * (x Wu^T)) Wd^T
  logits = (rmsnorm(h) * output_norm) Wout^T      (Wout = token_embd when tied)

Nothing here comes from the engine under test or from llama.cpp's ggml code:
weights are read with gguf.GGUFReader and dequantized with gguf.quants.dequantize.

GGUF specifics handled here:
  * GGUFReader reports shapes in ggml order (ne0 = innermost = input dim first);
    the numpy array `tensor.data` / dequantized array is row-major [out, in],
    i.e. the same orientation as an HF nn.Linear weight. Asserted on load.
  * The GGUF converter permutes the rows of attn_q / attn_k inside every head so
    that adjacent-pair ("GPT-J / NORM") RoPE on the GGUF layout equals HF's
    rotate_half RoPE on the HF layout. GGUF row 2j / 2j+1 of a head holds HF row
    j / j + d/2. We undo that permutation and then apply HF rotate_half RoPE.

Compute dtype: float64 by default (weights are dequantized exactly in float32,
then widened), so this is as close to "the exact function the quantized weights
define" as is cheap; --dtype float32 is available.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
import time

import numpy as np

import gguf
from gguf import quants

REFERENCE_VERSION = "1.0.0"


# ----------------------------------------------------------------------------
# GGUF helpers
# ----------------------------------------------------------------------------

def _field(reader: gguf.GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def unpermute_qk_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """GGUF (interleaved-pair) row order -> HF (rotate_half) row order.

    The converter did, per head:  hf.reshape(n_head, 2, d/2, in).swapaxes(1, 2)
    i.e. gguf row (h, 2j + s) = hf row (h, s*d/2 + j). Invert it.
    """
    out, inp = w.shape
    d = out // n_head
    assert d * n_head == out and d % 2 == 0
    return w.reshape(n_head, d // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


# ----------------------------------------------------------------------------
# Tokenizer (HF `tokenizers`, built from the GGUF vocab / merges)
# ----------------------------------------------------------------------------

def build_tokenizer(reader: gguf.GGUFReader):
    """Byte-level BPE as SmolLM2's tokenizer.json defines it:
    pre_tokenizer = Sequence[Digits(individual_digits=True),
                             ByteLevel(add_prefix_space=False, use_regex=True)],
    decoder = ByteLevel, control tokens (token_type 3) as special added tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, AddedToken

    model_name = _field(reader, "tokenizer.ggml.model")
    assert model_name == "gpt2", model_name
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    merges = _field(reader, "tokenizer.ggml.merges")
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate tokens in vocab"
    merge_pairs = [tuple(m.split(" ")) for m in merges]
    assert all(len(p) == 2 for p in merge_pairs)
    unk_id = _field(reader, "tokenizer.ggml.unknown_token_id")
    bpe = models.BPE(vocab=vocab, merges=merge_pairs,
                     unk_token=tokens[unk_id] if unk_id is not None else None,
                     fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(tokens[i], special=True, normalized=False)
                for i in range(len(tokens)) if int(types[i]) == 3]
    tok.add_special_tokens(specials)
    return tok


# ----------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------

class Config:
    def __init__(self, reader: gguf.GGUFReader):
        arch = _field(reader, "general.architecture")
        assert arch == "llama", arch
        p = arch + "."
        self.n_layer = int(_field(reader, p + "block_count"))
        self.n_embd = int(_field(reader, p + "embedding_length"))
        self.n_ff = int(_field(reader, p + "feed_forward_length"))
        self.n_head = int(_field(reader, p + "attention.head_count"))
        self.n_kv_head = int(_field(reader, p + "attention.head_count_kv", self.n_head))
        self.head_dim = self.n_embd // self.n_head
        self.rope_dim = int(_field(reader, p + "rope.dimension_count", self.head_dim))
        assert self.rope_dim == self.head_dim, "partial rotary not supported"
        self.rope_theta = float(_field(reader, p + "rope.freq_base", 10000.0))
        assert _field(reader, p + "rope.scaling.type") in (None, "none"), "rope scaling not supported"
        self.eps = float(_field(reader, p + "attention.layer_norm_rms_epsilon"))
        self.n_ctx = int(_field(reader, p + "context_length"))
        self.add_bos = bool(_field(reader, "tokenizer.ggml.add_bos_token", False))
        self.bos_id = _field(reader, "tokenizer.ggml.bos_token_id")
        self.eos_id = _field(reader, "tokenizer.ggml.eos_token_id")
        self.chat_template = _field(reader, "tokenizer.chat_template")

    def as_dict(self):
        return {k: v for k, v in vars(self).items() if k != "chat_template"}


class ReferenceModel:
    def __init__(self, path: str, dtype=np.float64, verbose: bool = True):
        t0 = time.time()
        self.path = path
        self.dtype = dtype
        reader = gguf.GGUFReader(path)
        self.reader = reader
        self.cfg = cfg = Config(reader)
        tensors = {t.name: t for t in reader.tensors}

        def load(name, expect_shape):
            t = tensors[name]
            # GGUFReader shape is ggml order (ne0 first) -> reversed numpy shape.
            assert tuple(int(x) for x in t.shape[::-1]) == tuple(expect_shape), (name, t.shape, expect_shape)
            w = quants.dequantize(t.data, t.tensor_type)
            w = np.asarray(w, dtype=np.float32).reshape(expect_shape)
            return w.astype(dtype)

        E, F, H, KV, D = cfg.n_embd, cfg.n_ff, cfg.n_head, cfg.n_kv_head, cfg.head_dim
        n_vocab = int(tensors["token_embd.weight"].shape[1])  # ggml order: [E, vocab]
        self.tok_embd = load("token_embd.weight", (n_vocab, E))
        self.n_vocab = self.tok_embd.shape[0]
        self.out_norm = load("output_norm.weight", (E,))
        if "output.weight" in tensors:
            self.lm_head = load("output.weight", (self.n_vocab, E))
            self.tied = False
        else:
            self.lm_head = self.tok_embd
            self.tied = True
        self.layers = []
        for i in range(cfg.n_layer):
            b = f"blk.{i}."
            L = {
                "attn_norm": load(b + "attn_norm.weight", (E,)),
                "wq": unpermute_qk_rows(load(b + "attn_q.weight", (H * D, E)), H),
                "wk": unpermute_qk_rows(load(b + "attn_k.weight", (KV * D, E)), KV),
                "wv": load(b + "attn_v.weight", (KV * D, E)),
                "wo": load(b + "attn_output.weight", (E, H * D)),
                "ffn_norm": load(b + "ffn_norm.weight", (E,)),
                "wg": load(b + "ffn_gate.weight", (F, E)),
                "wu": load(b + "ffn_up.weight", (F, E)),
                "wd": load(b + "ffn_down.weight", (E, F)),
            }
            for opt in ("attn_q.bias", "attn_k.bias", "attn_v.bias"):
                assert b + opt not in tensors, "attention biases not supported"
            self.layers.append(L)
        # HF LlamaRotaryEmbedding (default rope type): inv_freq[i] = theta^(-2i/d)
        self.inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, D, 2, dtype=np.float64) / D))
        self.reset()
        if verbose:
            print(f"[ref] loaded {path} in {time.time() - t0:.1f}s "
                  f"(layers={cfg.n_layer} E={E} H={H} KV={KV} D={D} F={F} vocab={self.n_vocab} "
                  f"theta={cfg.rope_theta} eps={cfg.eps} tied={self.tied} dtype={np.dtype(dtype).name})",
                  file=sys.stderr)

    # --- state ---------------------------------------------------------------
    def reset(self):
        cfg = self.cfg
        self.k_cache = [np.zeros((cfg.n_kv_head, 0, cfg.head_dim), self.dtype) for _ in range(cfg.n_layer)]
        self.v_cache = [np.zeros((cfg.n_kv_head, 0, cfg.head_dim), self.dtype) for _ in range(cfg.n_layer)]
        self.n_past = 0

    # --- building blocks --------------------------------------------------------
    def rmsnorm(self, x, w):
        var = np.mean(x * x, axis=-1, keepdims=True)
        return x / np.sqrt(var + self.cfg.eps) * w

    def rope(self, x, pos):
        """HF apply_rotary_pos_emb: x*cos + rotate_half(x)*sin, x: [heads, T, D]."""
        ang = np.outer(pos.astype(np.float64), self.inv_freq)          # [T, D/2]
        emb = np.concatenate([ang, ang], axis=-1)                       # [T, D]
        cos = np.cos(emb).astype(self.dtype)
        sin = np.sin(emb).astype(self.dtype)
        half = x.shape[-1] // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rot * sin

    @staticmethod
    def silu(x):
        return x / (1.0 + np.exp(-x))

    # --- forward -------------------------------------------------------------
    def forward(self, ids, dump=None, last_only=False):
        """Run tokens `ids` after the cached prefix; return logits [T, vocab]
        (or [1, vocab] for the last position only if last_only).
        If `dump` is a dict, named intermediates of layer 0 are stored in it."""
        cfg = self.cfg
        ids = np.asarray(ids, dtype=np.int64)
        T = len(ids)
        H, KV, D = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        n_rep = H // KV
        pos = np.arange(self.n_past, self.n_past + T)
        h = self.tok_embd[ids]                                           # [T, E]
        if dump is not None:
            dump["tokens"] = ids.copy()
            dump["positions"] = pos.copy()
            dump["embd"] = h.copy()
        S = self.n_past + T
        # causal mask: query t (abs pos n_past+t) sees keys 0..n_past+t
        mask = np.where(np.arange(S)[None, :] <= pos[:, None], 0.0, -np.inf).astype(self.dtype)
        scale = 1.0 / np.sqrt(D)
        for li, L in enumerate(self.layers):
            x = self.rmsnorm(h, L["attn_norm"])
            q = (x @ L["wq"].T).reshape(T, H, D).transpose(1, 0, 2)     # [H, T, D]
            k = (x @ L["wk"].T).reshape(T, KV, D).transpose(1, 0, 2)    # [KV, T, D]
            v = (x @ L["wv"].T).reshape(T, KV, D).transpose(1, 0, 2)
            if dump is not None and li == 0:
                dump["l0_attn_norm"] = x.copy()
                dump["l0_q_pre_rope"] = q.transpose(1, 0, 2).reshape(T, H * D).copy()
                dump["l0_k_pre_rope"] = k.transpose(1, 0, 2).reshape(T, KV * D).copy()
                dump["l0_v"] = v.transpose(1, 0, 2).reshape(T, KV * D).copy()
            q = self.rope(q, pos)
            k = self.rope(k, pos)
            self.k_cache[li] = np.concatenate([self.k_cache[li], k], axis=1)
            self.v_cache[li] = np.concatenate([self.v_cache[li], v], axis=1)
            Kc, Vc = self.k_cache[li], self.v_cache[li]                  # [KV, S, D]
            # GQA: q head hh uses kv head hh // n_rep (HF repeat_kv semantics)
            qg = q.reshape(KV, n_rep, T, D)
            scores = np.einsum("grtd,gsd->grts", qg, Kc) * scale + mask  # [KV, n_rep, T, S]
            scores = scores - scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p = p / p.sum(axis=-1, keepdims=True)
            a = np.einsum("grts,gsd->grtd", p, Vc).reshape(H, T, D)
            a = a.transpose(1, 0, 2).reshape(T, H * D)                   # [T, H*D]
            attn_out = a @ L["wo"].T
            h = h + attn_out
            if dump is not None and li == 0:
                dump["l0_q_rope"] = q.transpose(1, 0, 2).reshape(T, H * D).copy()
                dump["l0_k_rope"] = k.transpose(1, 0, 2).reshape(T, KV * D).copy()
                dump["l0_attn_probs"] = p.reshape(H, T, S).copy()
                dump["l0_attn_heads"] = a.copy()
                dump["l0_attn_out"] = attn_out.copy()
                dump["l0_resid_attn"] = h.copy()
            x = self.rmsnorm(h, L["ffn_norm"])
            g = x @ L["wg"].T
            u = x @ L["wu"].T
            act = self.silu(g) * u
            ffn_out = act @ L["wd"].T
            h = h + ffn_out
            if dump is not None and li == 0:
                dump["l0_ffn_norm"] = x.copy()
                dump["l0_ffn_gate"] = g.copy()
                dump["l0_ffn_up"] = u.copy()
                dump["l0_ffn_act"] = act.copy()
                dump["l0_ffn_out"] = ffn_out.copy()
                dump["l0_resid_ffn"] = h.copy()
            if dump is not None:
                dump[f"hidden_after_layer{li}"] = h[-1].copy()
        self.n_past += T
        if last_only:
            h = h[-1:]
        hn = self.rmsnorm(h, self.out_norm)
        logits = hn @ self.lm_head.T
        if dump is not None:
            dump["final_hidden"] = h.copy()
            dump["final_norm"] = hn.copy()
            dump["logits_last"] = logits[-1].copy()
        return logits

    def greedy(self, prompt_ids, n_new, stop_ids=()):
        """Prefill the prompt, then greedy-decode n_new tokens with the KV cache.
        Returns (last-prompt-position logits, generated ids, per-step top1-top2
        logit gap, per-step runner-up ids). Does not stop at EOS unless stop_ids given."""
        self.reset()
        logits = self.forward(prompt_ids, last_only=True)[-1]
        first = logits.copy()
        out, gaps, second = [], [], []
        cur = logits
        for _ in range(n_new):
            top2 = np.argsort(-cur, kind="stable")[:2]
            nxt = int(top2[0])
            gaps.append(float(cur[top2[0]] - cur[top2[1]]))
            second.append(int(top2[1]))
            out.append(nxt)
            if nxt in stop_ids:
                break
            cur = self.forward([nxt], last_only=True)[-1]
        return first, out, gaps, second


def chat_prompt(user_msg: str, system: str | None = None) -> str:
    """What the GGUF's tokenizer.chat_template renders for one user message with
    add_generation_prompt=True (the template inserts this default system prompt
    when the first message is not a system message)."""
    if system is None:
        system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{user_msg}<|im_end|>\n"
            f"<|im_start|>assistant\n")


def encode(tok, cfg: Config, text: str):
    ids = tok.encode(text, add_special_tokens=False).ids
    if cfg.add_bos:
        ids = [int(cfg.bos_id)] + ids
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--prompt", default=None, help="raw prompt text (default: chat question)")
    ap.add_argument("--chat", default="What is the capital of France?", help="user message, chat-formatted")
    ap.add_argument("-n", type=int, default=40)
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    args = ap.parse_args()
    m = ReferenceModel(args.model, dtype=np.dtype(args.dtype).type)
    tok = build_tokenizer(m.reader)
    text = args.prompt if args.prompt is not None else chat_prompt(args.chat)
    ids = encode(tok, m.cfg, text)
    print(f"prompt ({len(ids)} tokens): {ids}", file=sys.stderr)
    t0 = time.time()
    _, out, gaps, _ = m.greedy(ids, args.n)
    print(f"[ref] {len(out)} tokens in {time.time() - t0:.1f}s", file=sys.stderr)
    print(repr(tok.decode(out, skip_special_tokens=False)))


if __name__ == "__main__":
    main()
