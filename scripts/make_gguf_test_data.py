#!/usr/bin/env python3
"""Writes tests/data/gguf/quant_blocks.gguf: for each block type dhisparse dequantizes,
a tensor "<TYPE>.q" in that type and "<TYPE>.expected", its dequantization by the
reference Python `gguf` package (pip install gguf numpy), stored as F32.

The C++ test (tests/unit/test_dequant.cpp, DequantCrossCheck) compares our
dequantize_row against the expected tensors. Deterministic: re-running gives the same
bytes for the same gguf/numpy versions.

    python3 scripts/make_gguf_test_data.py [out.gguf]
"""
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

ROWS, COLS = 2, 512  # two rows of two K-quant super-blocks each
SEED = 20240611


def random_floats(rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32) * np.float32(0.05)
    x[0, :8] = [0.0, -0.0, 1.0, -3.5, 1e-6, -1e-6, 12.25, 65504.0]
    return x


def fp16_bytes(rng: np.random.Generator, n: int, lo: float, hi: float) -> np.ndarray:
    """n random finite fp16 values in [lo, hi), as raw bytes [n, 2]."""
    return rng.uniform(lo, hi, n).astype(np.float16).view(np.uint8).reshape(n, 2)


def random_k_blocks(rng: np.random.Generator, qtype: T) -> np.ndarray:
    """K-quant super-blocks with random quants and packed scales (every bit pattern,
    so scales >= 16 use their high bits) and finite positive fp16 d / dmin."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = ROWS * COLS // block_size
    blocks = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    if qtype == T.Q6_K:  # ql[128] qh[64] scales[16] d
        blocks[:, 208:210] = fp16_bytes(rng, n_blocks, 1e-4, 2e-2)
    else:  # d, dmin, scales[12], ...
        blocks[:, 0:2] = fp16_bytes(rng, n_blocks, 1e-4, 2e-2)
        blocks[:, 2:4] = fp16_bytes(rng, n_blocks, 1e-4, 2e-2)
    return blocks.reshape(ROWS, -1)


def random_q5_0_blocks(rng: np.random.Generator) -> np.ndarray:
    """Q5_0 blocks (fp16 d, u32 qh, qs[16]) with random qh / qs bytes, so every fifth-bit
    position and nibble pattern occurs, and finite fp16 d of both signs."""
    block_size, type_size = gguf.GGML_QUANT_SIZES[T.Q5_0]
    n_blocks = ROWS * COLS // block_size
    blocks = rng.integers(0, 256, (n_blocks, type_size), dtype=np.uint8)
    d = rng.uniform(1e-4, 2e-2, n_blocks) * rng.choice([-1.0, 1.0], n_blocks)
    blocks[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(ROWS, -1)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else (
        Path(__file__).resolve().parent.parent / "tests/data/gguf/quant_blocks.gguf")
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    w = gguf.GGUFWriter(str(out), arch="dhs_test")
    w.add_description("dequantization cross-check data, see scripts/make_gguf_test_data.py")

    for qtype in (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1):
        x = random_floats(rng)
        if qtype == T.F16:
            x[1, :5] = [np.inf, -np.inf, 6e-8, -3e-5, 1e-7]  # infinities and subnormals
        q = quantize(x, qtype)
        raw = q.view(np.uint8)
        expected = dequantize(raw, qtype).reshape(ROWS, COLS).astype(np.float32)
        if qtype in (T.F32, T.F16):
            w.add_tensor(f"{qtype.name}.q", q)
        else:
            w.add_tensor(f"{qtype.name}.q", raw, raw_dtype=qtype)
        w.add_tensor(f"{qtype.name}.expected", expected)

    for qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        raw = random_k_blocks(rng, qtype)
        expected = dequantize(raw, qtype).reshape(ROWS, COLS).astype(np.float32)
        assert np.isfinite(expected).all()
        w.add_tensor(f"{qtype.name}.q", raw, raw_dtype=qtype)
        w.add_tensor(f"{qtype.name}.expected", expected)

    # Added after the others so their random draws, and hence bytes, stay as they were.
    raw = random_q5_0_blocks(rng)
    expected = dequantize(raw, T.Q5_0).reshape(ROWS, COLS).astype(np.float32)
    assert np.isfinite(expected).all()
    w.add_tensor("Q5_0.q", raw, raw_dtype=T.Q5_0)
    w.add_tensor("Q5_0.expected", expected)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
