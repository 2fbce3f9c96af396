"""Read and write the safetensors format (an 8-byte little-endian header length, a JSON
header of dtype, shape and byte offsets per tensor plus string metadata, then the raw
little-endian bytes) without the `safetensors` package, which the GPU machine's image lacks.
Files written here are ordinary safetensors files: the package and other tools read them."""

from __future__ import annotations

import json
import pathlib
import struct

import torch

DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32"}  # fmt: skip
BY_NAME = {v: k for k, v in DTYPES.items()}


def save(path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """`tensors` (CPU or not; written contiguous, in name order) and string `metadata`."""
    header: dict = {"__metadata__": dict(metadata)}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype not in DTYPES:
            raise TypeError(f"tensors[{name!r}]: dtype {t.dtype} is not supported")
        data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}  # fmt: skip
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for data in blobs:
            f.write(data)


def load(path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors on the CPU, metadata) of a safetensors file."""
    raw = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    body = raw[8 + n :]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        dtype = BY_NAME[info["dtype"]]
        if end == start:  # torch.frombuffer refuses an empty buffer
            tensors[name] = torch.zeros(info["shape"], dtype=dtype)
            continue
        flat = torch.frombuffer(bytearray(body[start:end]), dtype=torch.uint8)
        tensors[name] = flat.view(dtype).reshape(info["shape"])
    return tensors, metadata


def metadata(path) -> dict[str, str]:
    """The metadata of a safetensors file, reading its header only."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)).get("__metadata__", {})
