"""Tensors between Python and the page: numpy arrays as raw little-endian bytes behind a JSON header."""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

#: numpy dtype <-> onnxruntime-web tensor type
WEB_TYPES: dict[np.dtype, str] = {
    np.dtype(np.float32): "float32", np.dtype(np.float16): "float16", np.dtype(np.int64): "int64",
    np.dtype(np.int32): "int32", np.dtype(np.bool_): "bool", np.dtype(np.uint8): "uint8", np.dtype(np.int8): "int8",
    np.dtype(np.float64): "float64"}
NP_TYPES: dict[str, np.dtype] = {v: k for k, v in WEB_TYPES.items()}


class WebError(RuntimeError):
    """A call in the page raised (the message is the browser's, verbatim) or the browser went away."""


def encode(arrays: Mapping[str, np.ndarray]) -> bytes:
    """uint32 header length, JSON header [{name, dtype, dims, offset, nbytes}], then the data (8-byte aligned)."""
    header, chunks, offset = [], [], 0
    for name, value in arrays.items():
        a = np.ascontiguousarray(value)
        if a.dtype not in WEB_TYPES:
            raise WebError(f"{name}: {a.dtype} cannot go to onnxruntime-web")
        data = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header.append({"name": name, "dtype": WEB_TYPES[a.dtype], "dims": list(a.shape), "offset": offset,
                       "nbytes": len(data)})
        pad = -len(data) % 8
        chunks.append(data + b"\0" * pad)
        offset += len(data) + pad
    head = json.dumps(header).encode()
    return len(head).to_bytes(4, "little") + head + b"".join(chunks)


def decode(blob: bytes) -> dict[str, np.ndarray]:
    n = int.from_bytes(blob[:4], "little")
    header = json.loads(blob[4:4 + n])
    base = 4 + n
    out = {}
    for t in header:
        dtype: np.dtype = NP_TYPES[t["dtype"]]
        start = base + t["offset"]
        out[t["name"]] = np.frombuffer(blob[start:start + t["nbytes"]], dtype=dtype).reshape(t["dims"]).copy()
    return out


__all__ = ["NP_TYPES", "WEB_TYPES", "WebError", "decode", "encode"]
