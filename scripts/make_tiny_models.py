#!/usr/bin/env python3
"""Tiny random Hugging Face checkpoints + an independent NumPy float64 reference
for the architecture variants of the Llama family that the default model
(SmolLM2, plain Llama) does not exercise:

  llama31_rope_scaled  LlamaForCausalLM, rope_scaling {"rope_type": "llama3"}
  qwen2_bias           Qwen2ForCausalLM: bias on q/k/v projections, tied lm_head
  qwen3_qknorm         Qwen3ForCausalLM: RMSNorm over head_dim on q and k per head
                       before RoPE, explicit head_dim != hidden / heads, untied

Writes tests/data/tiny_models/<name>/{config.json, model.safetensors, reference.json}.
Consumed by tests/e2e/test_tiny_models.cpp.

The reference is written from the Hugging Face model definitions, nothing from
the engine under test:

  h = embed(ids)
  for each layer:
      x = rmsnorm(h) * input_layernorm
      q, k, v = x Wq^T (+bq), x Wk^T (+bk), x Wv^T (+bv)      bias: Qwen2 only
      q, k = rmsnorm_head(q) * q_norm, rmsnorm_head(k) * k_norm   Qwen3 only (over head_dim)
      q, k = rotate_half RoPE (pairs i, i + d/2) with inv_freq (llama3-scaled if configured)
      a = softmax(q k^T / sqrt(head_dim) + causal) v   (GQA: q head h reads kv head h // n_rep)
      h = h + a Wo^T
      x = rmsnorm(h) * post_attention_layernorm
      h = h + (silu(x Wg^T) * (x Wu^T)) Wd^T
  logits = (rmsnorm(h) * norm) Wlm^T                     (Wlm = embed when tied)

Llama-3.1 RoPE scaling (transformers `_compute_llama3_parameters`), per frequency f:
  wavelen = 2 pi / f
  wavelen <  original_max / high_freq_factor  -> f            (high frequencies kept)
  wavelen >  original_max / low_freq_factor   -> f / factor   (low frequencies scaled)
  otherwise smooth = (original_max / wavelen - low) / (high - low)
            -> (1 - smooth) f / factor + smooth f

Weights are drawn from a fixed seed, stored as F32 with a safetensors writer
below (8-byte LE header length, JSON header, raw little-endian data), read back
from the file and only then run through the reference, so the reference sees
exactly the bytes the engine loads. Compute is float64.

Logits are stored as base64 little-endian float32 (rounding 6e-8 relative,
far below any test tolerance) to keep the data small.

Usage: python3 scripts/make_tiny_models.py [--out tests/data/tiny_models]
The output is deterministic (same bytes on every run).
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import math
import os
import struct

import numpy as np

GENERATOR_VERSION = "1.0.0"
VOCAB = 300
SEQ_LENGTHS = (5, 40, 300)
ALL_LOGITS_LEN = 40     # the sequence whose logits at every position are stored
N_GREEDY = 10
MIN_GREEDY_GAP = 0.01  # smallest top-2 logit gap allowed along a stored greedy continuation

# ----------------------------------------------------------------------------
# Model definitions
# ----------------------------------------------------------------------------

MODELS = {
    "llama31_rope_scaled": dict(
        seed=31,
        config={
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": VOCAB,
            "max_position_embeddings": 512,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            # head_dim 16, theta 1e4: wavelengths 6.3 (kept), 19.9 and 62.8 (blended,
            # smooth 0.74 and 0.006), 199 .. 19869 (divided by 8): all three regimes.
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "original_max_position_embeddings": 64,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
            },
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": True,
            "torch_dtype": "float32",
        },
    ),
    "qwen2_bias": dict(
        seed=2,
        config={
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": VOCAB,
            "max_position_embeddings": 512,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "hidden_act": "silu",
            "use_sliding_window": False,
            "tie_word_embeddings": True,
            "torch_dtype": "float32",
        },
    ),
    "qwen3_qknorm": dict(
        seed=3,
        config={
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "hidden_size": 96,
            "head_dim": 32,                # 4 * 32 = 128 != hidden 96
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": VOCAB,
            "max_position_embeddings": 512,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "hidden_act": "silu",
            "attention_bias": False,
            "use_sliding_window": False,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
        },
    ),
}


def arch_of(cfg: dict) -> str:
    return cfg["architectures"][0]


def head_dim_of(cfg: dict) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def make_weights(cfg: dict, seed: int) -> dict[str, np.ndarray]:
    """HF tensor name -> float32 array in nn.Linear orientation [out, in]."""
    rng = np.random.default_rng(seed)
    H, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    D = head_dim_of(cfg)
    Hq, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    arch = arch_of(cfg)

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm_w(n):  # around 1 so that a swapped/ignored norm still shows
        return (1.0 + rng.standard_normal(n) * 0.15).astype(np.float32)

    w: dict[str, np.ndarray] = {}
    # Embedding std 0.2: tied logits = rmsnormed h . row ~ N(0, (0.2 sqrt(H))^2), O(1-10).
    w["model.embed_tokens.weight"] = normal((V, H), 0.2)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = norm_w(H)
        # std 0.15 on q/k: scores q.k / sqrt(D) of order 1-2, attention neither flat nor one-hot.
        w[p + "self_attn.q_proj.weight"] = normal((Hq * D, H), 0.15)
        w[p + "self_attn.k_proj.weight"] = normal((Hkv * D, H), 0.15)
        w[p + "self_attn.v_proj.weight"] = normal((Hkv * D, H), 0.15)
        w[p + "self_attn.o_proj.weight"] = normal((H, Hq * D), 0.1)
        if arch == "Qwen2ForCausalLM":
            # Real Qwen2 k biases are large; make them matter here too.
            w[p + "self_attn.q_proj.bias"] = normal((Hq * D,), 0.3)
            w[p + "self_attn.k_proj.bias"] = normal((Hkv * D,), 0.5)
            w[p + "self_attn.v_proj.bias"] = normal((Hkv * D,), 0.3)
        if arch == "Qwen3ForCausalLM":
            # Norm weights around 1.5 so that the per-head normed q.k / sqrt(D) is O(1-2).
            w[p + "self_attn.q_norm.weight"] = (1.5 + rng.standard_normal(D) * 0.3).astype(np.float32)
            w[p + "self_attn.k_norm.weight"] = (1.5 + rng.standard_normal(D) * 0.3).astype(np.float32)
        w[p + "post_attention_layernorm.weight"] = norm_w(H)
        w[p + "mlp.gate_proj.weight"] = normal((F, H), 0.15)
        w[p + "mlp.up_proj.weight"] = normal((F, H), 0.15)
        w[p + "mlp.down_proj.weight"] = normal((H, F), 0.1)
    w["model.norm.weight"] = norm_w(H)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = normal((V, H), 0.2)
    return w


# ----------------------------------------------------------------------------
# safetensors (written and read here; format: u64 LE header size, JSON header
# {name: {dtype, shape, data_offsets: [begin, end)}} relative to the data start)
# ----------------------------------------------------------------------------

def write_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
    header: dict = {"__metadata__": {"format": "pt"}}
    blobs = []
    off = 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype="<f4")
        b = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)  # data section 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype="<f4").reshape(info["shape"]).copy()
    return out


# ----------------------------------------------------------------------------
# Reference forward (float64)
# ----------------------------------------------------------------------------

def rope_inv_freq(cfg: dict) -> np.ndarray:
    D = head_dim_of(cfg)
    theta = float(cfg.get("rope_theta", 10000.0))
    inv = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    rs = cfg.get("rope_scaling")
    if rs:
        kind = rs.get("rope_type", rs.get("type"))
        assert kind == "llama3", kind
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        orig = rs["original_max_position_embeddings"]
        out = np.empty_like(inv)
        for i, f in enumerate(inv):
            wavelen = 2.0 * math.pi / f
            if wavelen < orig / high:
                out[i] = f
            elif wavelen > orig / low:
                out[i] = f / factor
            else:
                smooth = (orig / wavelen - low) / (high - low)
                out[i] = (1.0 - smooth) * f / factor + smooth * f
        inv = out
    return inv


class TinyRef:
    def __init__(self, cfg: dict, weights: dict[str, np.ndarray]):
        self.cfg = cfg
        self.w = {k: v.astype(np.float64) for k, v in weights.items()}
        self.arch = arch_of(cfg)
        self.D = head_dim_of(cfg)
        self.Hq, self.Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.eps = float(cfg["rms_norm_eps"])
        self.inv_freq = rope_inv_freq(cfg)
        self.lm_head = self.w["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else self.w["lm_head.weight"]

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):
        """x: [T, heads, D]; HF rotate_half: out = x * cos + rotate_half(x) * sin."""
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]   # [T, D/2]
        cos = np.concatenate([np.cos(ang), np.cos(ang)], axis=-1)[:, None, :]
        sin = np.concatenate([np.sin(ang), np.sin(ang)], axis=-1)[:, None, :]
        half = self.D // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rot * sin

    def forward(self, ids) -> np.ndarray:
        """Logits [T, vocab] at every position."""
        w, D, Hq, Hkv = self.w, self.D, self.Hq, self.Hkv
        ids = np.asarray(ids)
        T = len(ids)
        pos = np.arange(T)
        h = w["model.embed_tokens.weight"][ids]
        causal = np.triu(np.full((T, T), -np.inf), k=1)
        for l in range(self.cfg["num_hidden_layers"]):
            p = f"model.layers.{l}."
            x = self.rmsnorm(h, w[p + "input_layernorm.weight"])
            q = x @ w[p + "self_attn.q_proj.weight"].T
            k = x @ w[p + "self_attn.k_proj.weight"].T
            v = x @ w[p + "self_attn.v_proj.weight"].T
            if self.arch == "Qwen2ForCausalLM":
                q = q + w[p + "self_attn.q_proj.bias"]
                k = k + w[p + "self_attn.k_proj.bias"]
                v = v + w[p + "self_attn.v_proj.bias"]
            q = q.reshape(T, Hq, D)
            k = k.reshape(T, Hkv, D)
            v = v.reshape(T, Hkv, D)
            if self.arch == "Qwen3ForCausalLM":
                q = self.rmsnorm(q, w[p + "self_attn.q_norm.weight"])
                k = self.rmsnorm(k, w[p + "self_attn.k_norm.weight"])
            q = self.rope(q, pos)
            k = self.rope(k, pos)
            rep = Hq // Hkv
            att = np.empty((T, Hq, D))
            for hq in range(Hq):
                hk = hq // rep
                s = q[:, hq, :] @ k[:, hk, :].T / math.sqrt(D) + causal
                s = s - s.max(axis=-1, keepdims=True)
                e = np.exp(s)
                att[:, hq, :] = (e / e.sum(axis=-1, keepdims=True)) @ v[:, hk, :]
            h = h + att.reshape(T, Hq * D) @ w[p + "self_attn.o_proj.weight"].T
            x = self.rmsnorm(h, w[p + "post_attention_layernorm.weight"])
            g = x @ w[p + "mlp.gate_proj.weight"].T
            u = x @ w[p + "mlp.up_proj.weight"].T
            h = h + ((g / (1.0 + np.exp(-g))) * u) @ w[p + "mlp.down_proj.weight"].T
        return self.rmsnorm(h, w["model.norm.weight"]) @ self.lm_head.T

    def greedy(self, ids, n):
        """n greedy ids after ids, each with the top-2 gap of the logits it came from."""
        ids = list(ids)
        out, gaps = [], []
        for _ in range(n):
            lg = self.forward(ids)[-1]
            top = np.argsort(lg)[::-1]
            out.append(int(top[0]))
            gaps.append(float(lg[top[0]] - lg[top[1]]))
            ids.append(int(top[0]))
        return out, gaps


def b64_f32(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode()


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def build(name: str, spec: dict, out_root: str) -> None:
    cfg = spec["config"]
    d = os.path.join(out_root, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    st_path = os.path.join(d, "model.safetensors")
    write_safetensors(st_path, make_weights(cfg, spec["seed"]))

    ref = TinyRef(cfg, read_safetensors(st_path))
    rng = np.random.default_rng(1000 + spec["seed"])
    seqs = []
    for n in SEQ_LENGTHS:
        # Redraw until every greedy step has a clear winner, so that the test's
        # exact-id check cannot flip on f32 rounding (engine error is ~1e-5).
        while True:
            ids = [int(t) for t in rng.integers(0, VOCAB, size=n)]
            greedy, gaps = ref.greedy(ids, N_GREEDY)
            if min(gaps) >= MIN_GREEDY_GAP:
                break
        logits = ref.forward(ids)
        last = logits[-1]
        top2 = np.sort(last)[-2:]
        entry = {
            "name": f"len{n}",
            "ids": ids,
            "logits_last_b64_f32le": b64_f32(last),
            "greedy_ids": greedy,
            "greedy_top2_gap": [round(g, 6) for g in gaps],
        }
        if n == ALL_LOGITS_LEN:
            entry["logits_all_b64_f32le"] = b64_f32(logits)  # [n, vocab] row-major
        seqs.append(entry)
        print(f"  {name:20s} len {n:3d}: last logits range [{last.min():+.2f}, {last.max():+.2f}] "
              f"std {last.std():.2f}, top2 gap {top2[1] - top2[0]:.3f}, "
              f"min greedy gap {min(gaps):.3f}, greedy {greedy}")
    doc = {
        "generator": "scripts/make_tiny_models.py",
        "generator_version": GENERATOR_VERSION,
        "reference": "NumPy float64 forward written from the HF model definitions; logits stored as f32",
        "arch": arch_of(cfg),
        "seed": spec["seed"],
        "model_sha256": sha256(st_path),
        "inv_freq": [float(f) for f in ref.inv_freq],
        "sequences": seqs,
    }
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "tiny_models"))
    ap.add_argument("--only", nargs="*", help="model names (default: all)")
    args = ap.parse_args()
    for name, spec in MODELS.items():
        if args.only and name not in args.only:
            continue
        build(name, spec, os.path.normpath(args.out))


if __name__ == "__main__":
    main()
