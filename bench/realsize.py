"""Real-size onnxruntime-genai decoder folders, built in code: real graphs, sparse all-zero weights.

Each builder takes a tiny graph that onnxruntime-genai's model builder really emitted (the corpus under
``/work/shared/corpus/genai``: hidden 128, 2 layers) and scales it to a real checkpoint's config:

* the per-layer node block of layer 1 is replicated to N layers (layer 0 keeps its own block, the final norm and
  lm_head follow), with every ``/model/layers.i/``, ``model.layers.i.``, ``past_key_values.i.`` and ``present.i.``
  name renumbered the way the builder numbers them;
* every initializer gets the real shape (q/k/v/qkv/o/gate/up/down/embed/lm_head/norms, cos/sin caches, inv_freq);
* shape constants that encode a config dimension (Reshape targets ``[0, 0, heads, head]``, ``[0, 0, hidden]``,
  ``[-1, head/2]``, Slice ends, Expand shapes, mRoPE sections, the LongRoPE switch ``Greater(total, original_max)``)
  and attributes (num_heads, kv_num_heads, scale, rotary_embedding_dim, mrope_section, epsilon) get the real values;
  constants named by value (``/model/constants/INT64/[0, 0, 4, 32]``) are renamed like the builder names them;
* value_info entries (the builder writes them) are renumbered and resized too;
* ``genai_config.json`` gets the real sizes (and LongRoPE's ``multiRotaryCacheConcatOffset``).

Weights live in ``model.onnx.data`` at the real byte size but as a SPARSE file (``truncate``): the MatMul weights,
embedding and lm_head are all zeros and take no disk space. RoPE data (cos/sin caches, inv_freq) holds real values
computed like the builder computes them (checked against the tiny builds: max error 1e-7); norm weights are ones.
Never copy these folders with a non-sparse copy (``cp --sparse=always`` keeps them sparse).

    from bench import realsize  # or: python bench/realsize.py --list / NAME OUT [--layers N]
    realsize.build("qwen25vl-7b-legacy", "/work/tmp/q")   # -> Path of the folder
    realsize.smoke("/tmp/s")                                # every model at 2 layers, context 256 (< 10 s)
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

_REPO = Path(__file__).resolve().parents[1]
#: the tiny real builds (as tests/conftest.py finds them: $ROPE_PASSES_SHARED or ../shared beside the checkout)
CORPUS = Path(os.environ.get("ROPE_PASSES_CORPUS") or Path(
    os.environ.get("ROPE_PASSES_SHARED", _REPO.parent / "shared")) / "corpus" / "genai")


@dataclasses.dataclass(frozen=True)
class Config:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head: int
    inter: int
    vocab: int
    context: int  # rows of the cos/sin cache (LongRoPE: the long cache)
    theta: float
    eps: float
    mrope_section: tuple[int, ...] = ()
    original_context: int = 0  # LongRoPE: rows of the short cache, the If(Greater(total, ...)) threshold
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()

    @property
    def half(self) -> int:
        return self.head // 2

    @property
    def q_size(self) -> int:
        return self.heads * self.head

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head


# Phi-3-mini-128k-instruct's rescale factors are 48 published numbers; these are smooth stand-ins of the same range
# (short ~1.0..1.2, long ~1.0..60): the graph and the byte sizes are what matter here, not the exact curve.
_PHI3_SHORT = tuple(float(x) for x in np.round(np.linspace(1.0, 1.19, 48), 4))
_PHI3_LONG = tuple(float(x) for x in np.round(np.geomspace(1.08, 60.0, 48), 4))

CONFIGS = {
    "qwen25vl-3b": Config(hidden=2048, layers=36, heads=16, kv_heads=2, head=128, inter=11008, vocab=151936,
                          context=128000, theta=1e6, eps=1e-6, mrope_section=(16, 24, 24)),
    "qwen25vl-7b": Config(hidden=3584, layers=28, heads=28, kv_heads=4, head=128, inter=18944, vocab=152064,
                          context=128000, theta=1e6, eps=1e-6, mrope_section=(16, 24, 24)),
    "phi3-mini-128k": Config(hidden=3072, layers=32, heads=32, kv_heads=32, head=96, inter=8192, vocab=32064,
                             context=131072, theta=10000.0, eps=1e-5, original_context=4096,
                             short_factor=_PHI3_SHORT, long_factor=_PHI3_LONG),
    "llama3-8b": Config(hidden=4096, layers=32, heads=32, kv_heads=8, head=128, inter=14336, vocab=128256,
                        context=8192, theta=500000.0, eps=1e-5),
    "llama3-70b": Config(hidden=8192, layers=80, heads=64, kv_heads=8, head=128, inter=28672, vocab=128256,
                         context=8192, theta=500000.0, eps=1e-5),
}


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str  # corpus folder of the tiny real build
    config: str  # key of CONFIGS
    form: str  # what `rope-passes inspect` should call it (for the report)
    description: str
    int4: bool = False  # the builder's ``-p int4`` form: every weight MatMul a MatMulNBits (:func:`quantize_int4`)


MODELS = {
    m.name: m
    for m in [
        ModelSpec("qwen25vl-3b-legacy", "legacy/qwen25_vl/webgpu_fp16_graph", "qwen25vl-3b", "manual mRoPE",
                  "Qwen2.5-VL-3B text decoder, builder 0.15.2 manual mRoPE subgraph, fp16, inputs_embeds"),
        ModelSpec("qwen25vl-3b", "current/qwen25_vl/webgpu_fp16", "qwen25vl-3b", "MRotaryEmbedding",
                  "Qwen2.5-VL-3B text decoder, builder 0.18 com.microsoft::MRotaryEmbedding, GQA do_rotary=0, fp16"),
        ModelSpec("qwen25vl-7b-legacy", "legacy/qwen25_vl/webgpu_fp16_graph", "qwen25vl-7b", "manual mRoPE",
                  "Qwen2.5-VL-7B text decoder, builder 0.15.2 manual mRoPE subgraph, fp16, inputs_embeds"),
        ModelSpec("qwen25vl-7b", "current/qwen25_vl/webgpu_fp16", "qwen25vl-7b", "MRotaryEmbedding",
                  "Qwen2.5-VL-7B text decoder, builder 0.18 com.microsoft::MRotaryEmbedding, GQA do_rotary=0, fp16"),
        ModelSpec("phi3-mini-128k", "current/phi3_mini_128k/webgpu_fp32", "phi3-mini-128k", "LongRoPE If",
                  "Phi-3-mini-128k, builder 0.18 LongRoPE If(Greater(total, 4096)) short/long caches, fp32"),
        ModelSpec("phi3-mini-128k-graph", "current/phi3_mini_128k/webgpu_fp16_graph", "phi3-mini-128k",
                  "LongRoPE concat", "Phi-3-mini-128k, builder 0.18 enable_webgpu_graph: concatenated cache, fp16"),
        ModelSpec("llama3-8b", "current/llama/webgpu_fp16", "llama3-8b", "GQA do_rotary",
                  "Llama-3-8B, builder 0.18 GQA do_rotary=1, fp16"),
        ModelSpec("llama3-8b-graph", "current/llama/webgpu_fp16_graph", "llama3-8b", "GQA do_rotary",
                  "Llama-3-8B, builder 0.18 GQA do_rotary=1, enable_webgpu_graph, fp16"),
        ModelSpec("llama3-70b", "current/llama/webgpu_fp16", "llama3-70b", "GQA do_rotary",
                  "Llama-3-70B shape (80 layers), builder 0.18 GQA do_rotary=1, fp16 (~141 GB apparent)"),
        # int4 (issue 31): the builder's -p int4 -e webgpu graphs (fp16 activations, MatMulNBits block 32)
        ModelSpec("qwen25vl-3b-legacy-int4", "legacy/qwen25_vl/webgpu_fp16_graph", "qwen25vl-3b", "manual mRoPE",
                  "Qwen2.5-VL-3B text, builder 0.15.2 manual mRoPE, enable_webgpu_graph, int4", int4=True),
        ModelSpec("qwen25vl-3b-int4", "current/qwen25_vl/webgpu_fp16", "qwen25vl-3b", "MRotaryEmbedding",
                  "Qwen2.5-VL-3B text, builder 0.18 MRotaryEmbedding, int4", int4=True),
        ModelSpec("qwen25vl-3b-graph-int4", "current/qwen25_vl/webgpu_int4_graph", "qwen25vl-3b", "MRotaryEmbedding",
                  "Qwen2.5-VL-3B text, builder 0.18 MRotaryEmbedding, enable_webgpu_graph, int4 (the builder's own "
                  "int4 graph scaled)", int4=True),
        ModelSpec("phi3-mini-128k-graph-int4", "current/phi3_mini_128k/webgpu_fp16_graph", "phi3-mini-128k",
                  "LongRoPE concat", "Phi-3-mini-128k, builder 0.18 enable_webgpu_graph: concatenated cache, int4",
                  int4=True),
        ModelSpec("llama3-8b-int4", "current/llama/webgpu_fp16", "llama3-8b", "GQA do_rotary",
                  "Llama-3-8B, builder 0.18 GQA do_rotary=1, int4", int4=True),
        ModelSpec("llama3-8b-graph-int4", "current/llama/webgpu_fp16_graph", "llama3-8b", "GQA do_rotary",
                  "Llama-3-8B, builder 0.18 enable_webgpu_graph, int4", int4=True),
    ]
}

#: the fp16 model each int4 model is the int4 form of (same source graph, same config); the corpus has no fp16
#: enable_webgpu_graph build of builder 0.18's qwen25_vl, so qwen25vl-3b-graph-int4 has none
FP16_OF = {"qwen25vl-3b-legacy-int4": "qwen25vl-3b-legacy", "qwen25vl-3b-int4": "qwen25vl-3b",
           "phi3-mini-128k-graph-int4": "phi3-mini-128k-graph", "llama3-8b-int4": "llama3-8b",
           "llama3-8b-graph-int4": "llama3-8b-graph"}


# ------------------------------------------------------------------------------------------------- int4

#: what onnxruntime-genai 0.18's builder writes for ``-p int4`` (onnxruntime's MatMulNBitsQuantizer, its default
#: symmetric algorithm: no zero points), read off the corpus's current/qwen25_vl/webgpu_int4_graph
INT4_BLOCK, INT4_ACCURACY = 32, 4


def quantize_int4(model: onnx.ModelProto) -> onnx.ModelProto:
    """The builder's int4 form of a builder fp16 graph, in place: every ``MatMul`` reading a ``*.MatMul.weight``
    initializer [K, N] becomes ``com.microsoft::MatMulNBits`` named ``<name>_Q4`` reading ``<weight>_Q4`` (uint8
    [N, K/32, 16]) and ``<weight>_scales`` (the activation type, [N, K/32]), attributes K, N, accuracy_level 4,
    bits 4, block_size 32; the output keeps its name. The new initializers carry no data (the scaler writes it)."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    new_nodes, dropped, added = [], set(), []
    for n in g.node:
        w = inits.get(n.input[1]) if n.op_type == "MatMul" and len(n.input) == 2 else None
        if w is None or not w.name.endswith(".MatMul.weight"):
            new_nodes.append(n)
            continue
        k, nn = (int(d) for d in w.dims)
        blocks = -(-k // INT4_BLOCK)
        q = onnx.helper.make_tensor_value_info(w.name + "_Q4", TensorProto.UINT8, [nn, blocks, INT4_BLOCK // 2])
        qt = onnx.TensorProto(name=q.name, data_type=TensorProto.UINT8, dims=[nn, blocks, INT4_BLOCK // 2])
        st = onnx.TensorProto(name=w.name + "_scales", data_type=w.data_type, dims=[nn, blocks])
        added += [qt, st]
        dropped.add(w.name)
        new_nodes.append(onnx.helper.make_node(
            "MatMulNBits", [n.input[0], qt.name, st.name], list(n.output), name=n.name + "_Q4", domain="com.microsoft",
            K=k, N=nn, accuracy_level=INT4_ACCURACY, bits=4, block_size=INT4_BLOCK))
    kept = [i for i in g.initializer if i.name not in dropped]
    del g.node[:], g.initializer[:]
    g.node.extend(new_nodes)
    g.initializer.extend(kept + added)
    if added and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    return model


# ----------------------------------------------------------------------------------------------- tiny config

def tiny_config(source: Path) -> Config:
    """The config the tiny corpus build was made from (genai_config.json + the checkpoint's config.json)."""
    gc = json.loads((source / "genai_config.json").read_text())["model"]
    dec = gc["decoder"]
    family = source.parent.name
    hf = json.loads((CORPUS / "hf" / family / "config.json").read_text())
    text = hf.get("text_config", hf)
    rope = text.get("rope_parameters") or {}
    return Config(hidden=dec["hidden_size"], layers=dec["num_hidden_layers"], heads=dec["num_attention_heads"],
                  kv_heads=dec["num_key_value_heads"], head=dec["head_size"], inter=text["intermediate_size"],
                  vocab=gc["vocab_size"], context=text["max_position_embeddings"],
                  theta=float(rope.get("rope_theta", text.get("rope_theta", 10000.0))),
                  eps=float(text.get("rms_norm_eps", 1e-6)), mrope_section=tuple(rope.get("mrope_section", ())),
                  original_context=int(text.get("original_max_position_embeddings") or 0),
                  short_factor=tuple(rope.get("short_factor", ())), long_factor=tuple(rope.get("long_factor", ())))


# ------------------------------------------------------------------------------------------- RoPE values

def inv_freq(cfg: Config, factors: tuple[float, ...] = ()) -> np.ndarray:
    inv = 1.0 / (cfg.theta ** (np.arange(0, cfg.head, 2, dtype=np.float32) / cfg.head))
    if factors:
        inv = inv / np.asarray(factors, np.float32)
    return inv.astype(np.float32)


def cos_sin(cfg: Config, rows: int, factors: tuple[float, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """[rows, head/2] caches as the builder computes them (LongRoPE: times the attention factor)."""
    freqs = np.outer(np.arange(rows, dtype=np.float32), inv_freq(cfg, factors))
    scale = 1.0
    if cfg.original_context and cfg.context > cfg.original_context:
        scale = math.sqrt(1 + math.log(cfg.context / cfg.original_context) / math.log(cfg.original_context))
    return (np.cos(freqs) * scale).astype(np.float32), (np.sin(freqs) * scale).astype(np.float32)


def _cache_values(name: str, cfg: Config) -> np.ndarray | None:
    """Real values for RoPE tensors by name; None for weights (sparse zeros) and norms (ones)."""
    if name == "model.inv_freq":
        return inv_freq(cfg)
    if name in ("cos_cache", "sin_cache"):
        k = 0 if name == "cos_cache" else 1
        if cfg.original_context:  # the enable_webgpu_graph form: concat(short, long)
            return np.concatenate([cos_sin(cfg, cfg.original_context, cfg.short_factor)[k],
                                   cos_sin(cfg, cfg.context, cfg.long_factor)[k]])
        return cos_sin(cfg, cfg.context)[k]
    if name in ("cos_cache_small", "sin_cache_small"):
        return cos_sin(cfg, cfg.original_context, cfg.short_factor)[0 if "cos" in name else 1]
    if name in ("cos_cache_large", "sin_cache_large"):
        return cos_sin(cfg, cfg.context, cfg.long_factor)[0 if "cos" in name else 1]
    return None


# ------------------------------------------------------------------------------------------ shapes by role

def _init_shape(name: str, shape: list[int], t: Config, r: Config) -> list[int]:
    """Real shape of a builder initializer, by name."""
    q4 = re.match(r"^(.*\.MatMul\.weight)_(Q4|scales)$", name)
    if q4:  # MatMulNBits: the float weight [K, N] as [N, K/32, 16] (uint8) and [N, K/32] (scales)
        k, n = _init_shape(q4.group(1), [], t, r)
        blocks = -(-k // INT4_BLOCK)
        return [n, blocks, INT4_BLOCK // 2] if q4.group(2) == "Q4" else [n, blocks]
    rules = [
        (r"embed_tokens\.weight$", [r.vocab, r.hidden]),
        (r"lm_head\.MatMul\.weight$", [r.hidden, r.vocab]),
        (r"layernorm\.weight$|norm\.weight$", [r.hidden]),
        (r"attn\.qkv_proj\.MatMul\.weight$", [r.hidden, r.q_size + 2 * r.kv_size]),
        (r"attn\.q_proj\.MatMul\.weight$", [r.hidden, r.q_size]),
        (r"attn\.[kv]_proj\.MatMul\.weight$", [r.hidden, r.kv_size]),
        (r"attn\.o_proj\.MatMul\.weight$", [r.q_size, r.hidden]),
        (r"mlp\.(gate|up)_proj\.MatMul\.weight$", [r.hidden, r.inter]),
        (r"mlp\.down_proj\.MatMul\.weight$", [r.inter, r.hidden]),
        (r"attn\.q_proj\.Add\.bias$", [r.q_size]),
        (r"attn\.[kv]_proj\.Add\.bias$", [r.kv_size]),
        (r"^model\.inv_freq$", [r.half]),
    ]
    for pat, real in rules:
        if re.search(pat, name):
            return real
    if name in ("cos_cache", "sin_cache"):
        rows = r.original_context + r.context if r.original_context else r.context
        return [rows, r.half]
    raise ValueError(f"realsize: no shape rule for initializer {name!r} {shape}")


def _value_dims(name: str, dims: list, t: Config, r: Config) -> list | None:
    """Real static dims of a value_info entry by its builder name; None when unsure (the entry is dropped)."""
    if len(dims) <= 1:  # scalars and shape vectors ([2], [3], [4]) keep their lengths
        return dims
    out = list(dims)
    chunk = re.search(r"/chunk_(\d+)/", name)

    def mapped(d, table):
        if not isinstance(d, int) or d == 1:
            return d
        if d not in table:
            raise KeyError(d)
        return table[d]

    if chunk:
        table = {t.mrope_section[int(chunk.group(1))]: r.mrope_section[int(chunk.group(1))]}
    elif "/mrope_dynamic_cache/" in name:
        table = {t.half: r.half, t.head: r.head, 3: 3}
    elif "/mrope_flattened_cache/" in name:
        table = {t.half: r.half, 3: 3}
    elif re.search(r"/q_(m)?rope/|/q_rotary/", name):
        table = {t.heads: r.heads, t.head: r.head, t.q_size: r.q_size}
    elif re.search(r"/k_(m)?rope/|/k_rotary/|/[kv]_proj/", name):
        table = {t.kv_heads: r.kv_heads, t.head: r.head, t.kv_size: r.kv_size}
    elif "/q_proj/" in name:
        table = {t.q_size: r.q_size}
    elif "/qkv_proj/" in name:
        table = {t.q_size + 2 * t.kv_size: r.q_size + 2 * r.kv_size}
    elif "/mlp/" in name and "/down_proj/" not in name:
        table = {t.inter: r.inter}
    elif name == "logits":
        table = {t.vocab: r.vocab}
    else:
        table = {t.hidden: r.hidden}
    try:
        return [mapped(d, table) for d in out]
    except KeyError:
        return None


# --------------------------------------------------------------------------------------------- renaming

_LAYER_PATS = [re.compile(p) for p in (r"(/model/layers\.)(\d+)(/)", r"(model\.layers\.)(\d+)(\.)",
                                       r"(past_key_values\.)(\d+)(\.)", r"(present\.)(\d+)(\.)")]
_LAYER_OF_NODE = re.compile(r"^/model/layers\.(\d+)/")


def _renamer(layer_map: dict[int, int], names: dict[str, str]):
    def rename(s: str) -> str:
        if not s:
            return s
        s = names.get(s, s)
        for pat in _LAYER_PATS:
            s = pat.sub(lambda m: f"{m.group(1)}{layer_map.get(int(m.group(2)), int(m.group(2)))}{m.group(3)}", s)
        return s
    return rename


def _rename_node(node: onnx.NodeProto, rename) -> onnx.NodeProto:
    n = copy.deepcopy(node)
    n.name = rename(n.name)
    for i, v in enumerate(n.input):
        n.input[i] = rename(v)
    for i, v in enumerate(n.output):
        n.output[i] = rename(v)
    return n


# -------------------------------------------------------------------------------------------- constants

_INDEX_LIKE = {(0,), (1,), (2,), (3,), (-1,), (0, 1, 3)}


def _const_key(value: np.ndarray) -> tuple:
    return tuple(int(x) for x in np.atleast_1d(value).ravel())


def _const_map(t: Config, r: Config) -> dict[tuple, tuple]:
    m = {
        (-1, t.half): (-1, r.half),
        (0, 0, t.q_size): (0, 0, r.q_size),
        (0, 0, t.kv_size): (0, 0, r.kv_size),
        (0, 0, t.heads, t.head): (0, 0, r.heads, r.head),
        (0, 0, t.kv_heads, t.head): (0, 0, r.kv_heads, r.head),
        (t.half, 1): (r.half, 1),
        (t.half,): (r.half,),
    }
    if t.mrope_section:
        m[tuple(t.mrope_section)] = tuple(r.mrope_section)
    return m


def _const_name(dtype: str, value: np.ndarray) -> str:
    v = value.tolist()
    return f"{dtype}/{v}"


# ------------------------------------------------------------------------------------------------ build

def build(name: str, out: str | os.PathLike, layers: int | None = None, context: int | None = None,
          corpus: str | os.PathLike | None = None, config: Config | None = None, seed: int | None = None) -> Path:
    """Write the genai folder ``out`` (model.onnx + sparse model.onnx.data + genai_config.json); returns it.

    ``layers`` overrides the layer count (per-layer slopes), ``context`` the cos/sin cache rows (LongRoPE: the long
    cache; the short one stays at original_context unless it is larger), ``config`` the whole config. ``seed``:
    every weight random instead of zero (dense: for small configs, where a check must see real numbers).
    """
    spec = MODELS[name]
    source = Path(corpus or CORPUS) / spec.source
    t = tiny_config(source)
    r = config or CONFIGS[spec.config]
    if layers is not None:
        r = dataclasses.replace(r, layers=layers)
    if context is not None:
        r = dataclasses.replace(r, context=context, original_context=min(r.original_context, context // 2)
                                if r.original_context else 0)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(source / "model.onnx"), load_external_data=False)
    if spec.int4:
        quantize_int4(model)  # a no-op on a source the builder wrote in int4
    _scale_model(model, t, r, out / "model.onnx.data", seed)
    onnx.save(model, str(out / "model.onnx"))
    _write_genai_config(source, out, r)
    return out


def _scale_model(model: onnx.ModelProto, t: Config, r: Config, data_path: Path, seed: int | None = None) -> None:
    g = model.graph
    N, TL = r.layers, t.layers
    assert TL >= 2 and N >= 1, (TL, N)

    # consumers of every value (top level and subgraphs), for the constant rules
    consumers: dict[str, set[str]] = {}

    def scan(graph):
        for n in graph.node:
            for v in n.input:
                consumers.setdefault(v, set()).add(n.op_type)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    scan(a.g)
    scan(g)

    # 1. constants: real values for the config-dependent ones, renamed like the builder names them
    cmap = _const_map(t, r)
    const_names: dict[str, str] = {}
    for n in g.node:
        if n.op_type != "Constant":
            continue
        tensor = n.attribute[0].t
        val = numpy_helper.to_array(tensor)
        key = _const_key(val)
        users = consumers.get(n.output[0], set())
        if users == {"Greater"} and t.original_context and key == (t.original_context,):
            new = np.array(r.original_context, dtype=val.dtype).reshape(val.shape)
        elif key in cmap and tensor.data_type == TensorProto.INT64:
            new = np.array(cmap[key], dtype=val.dtype).reshape(val.shape)
        elif key in _INDEX_LIKE or tensor.data_type != TensorProto.INT64:
            continue
        else:
            raise ValueError(f"realsize: constant {n.output[0]} = {key} used by {users}: no rule")
        n.attribute[0].t.CopyFrom(numpy_helper.from_array(new, tensor.name))
        m = re.match(r"^(/model/constants/)([A-Z0-9]+/)(.*)$", n.output[0])
        if m:
            new_out = m.group(1) + _const_name(m.group(2)[:-1], new)
            const_names[n.output[0]] = new_out
            n.name = n.name.replace(m.group(3), str(new.tolist()))
    if len(set(const_names.values())) != len(const_names) or set(const_names.values()) & (
            {o for n in g.node for o in n.output} - set(const_names)):
        raise ValueError(f"realsize: renamed constants collide: {const_names}")

    # 2. nodes in the builder's order: layer 0, layer 1 replicated to layers 1..N-1 (its first copy where layer 1
    #    was, the others right before the final norm), the final norm renumbered to N, lm_head; the shared nodes
    #    (constants, mask reformatting, cache selection) stay where the builder put them
    same = _renamer({}, const_names)
    fin = _renamer({TL: N, TL - 1: N - 1}, const_names)

    def copy_for(i):
        return _renamer({TL - 1: i, TL - 2: i - 1}, const_names)

    layer_outputs: set[str] = set()
    for n in g.node:
        m = _LAYER_OF_NODE.match(n.name)
        if m and int(m.group(1)) < TL:
            layer_outputs.update(n.output)
    nodes: list[onnx.NodeProto] = []
    template: list[onnx.NodeProto] = []
    in_epilogue = False
    for n in g.node:
        m = _LAYER_OF_NODE.match(n.name)
        li = int(m.group(1)) if m else None
        if li is not None and li < TL - 1:
            if li != 0:
                raise ValueError("realsize: tiny builds with more than 2 layers are not supported")
            nodes.append(_rename_node(n, same))
        elif li == TL - 1:
            template.append(n)
            if N > 1:
                nodes.append(_rename_node(n, copy_for(1)))
        elif li == TL or in_epilogue:
            if not in_epilogue:
                in_epilogue = True
                for i in range(2, N):
                    nodes += [_rename_node(t_n, copy_for(i)) for t_n in template]
            nodes.append(_rename_node(n, fin))
        else:
            if set(n.input) & layer_outputs:
                raise ValueError(f"realsize: shared node {n.name} reads a layer value")
            nodes.append(_rename_node(n, same))

    # 3. attributes
    def fix_attrs(graph):
        for n in graph.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    fix_attrs(a.g)
            attrs = {a.name: a for a in n.attribute}
            if n.op_type == "GroupQueryAttention":
                attrs["num_heads"].i = r.heads
                attrs["kv_num_heads"].i = r.kv_heads
                attrs["scale"].f = 1.0 / math.sqrt(r.head)
            elif n.op_type in ("RotaryEmbedding", "MRotaryEmbedding"):
                is_q = re.search(r"/q_(m)?rope/|/q_rotary/", n.name) is not None
                attrs["num_heads"].i = r.heads if is_q else r.kv_heads
                if "rotary_embedding_dim" in attrs and attrs["rotary_embedding_dim"].i:
                    assert attrs["rotary_embedding_dim"].i == t.head
                    attrs["rotary_embedding_dim"].i = r.head
                if "mrope_section" in attrs:
                    del attrs["mrope_section"].ints[:]
                    attrs["mrope_section"].ints.extend(r.mrope_section)
            elif n.op_type in ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"):
                attrs["epsilon"].f = r.eps
            elif n.op_type == "MatMulNBits":
                k, nn = _init_shape(n.input[1][:-len("_Q4")], [], t, r)
                attrs["K"].i, attrs["N"].i = k, nn
            elif n.op_type == "If":  # LongRoPE: small/large caches inline in the branches, as the builder does
                for branch in ("then_branch", "else_branch"):
                    sub = attrs[branch].g
                    for sn in sub.node:
                        if sn.op_type == "Constant":
                            vals = _cache_values(sn.output[0], r)
                            if vals is None:
                                raise ValueError(f"realsize: If constant {sn.output[0]} has no rule")
                            sn.attribute[0].t.CopyFrom(numpy_helper.from_array(
                                vals.astype(numpy_helper.to_array(sn.attribute[0].t).dtype), sn.attribute[0].t.name))
                    for o in sub.output:
                        vals = _cache_values(o.name, r)
                        d = o.type.tensor_type.shape.dim
                        d[0].dim_value, d[1].dim_value = vals.shape
    del g.node[:]
    g.node.extend(nodes)
    fix_attrs(g)

    # 4. initializers: replicated, real shapes, external data in a sparse file
    inits = list(g.initializer)
    new_inits: list[onnx.TensorProto] = []

    def layer_of_init(nm):
        m = re.match(r"^model\.layers\.(\d+)\.", nm)
        return int(m.group(1)) if m else None

    by_layer = {}
    for ini in inits:
        by_layer.setdefault(layer_of_init(ini.name), []).append(ini)
    order: list[tuple[onnx.TensorProto, str]] = []
    first_layer_seen = False
    for ini in inits:  # keep the builder's interleaving: globals where they were, layers in sequence
        li = layer_of_init(ini.name)
        if li is None or li == 0:
            order.append((ini, ini.name))
        elif li == TL - 1 and not first_layer_seen:
            first_layer_seen = True
            for i in range(1, N):
                for t_ini in by_layer[TL - 1]:
                    order.append((t_ini, _renamer({TL - 1: i}, {})(t_ini.name)))
        elif li == TL:
            order.append((ini, _renamer({TL: N}, {})(ini.name)))
    offset = 0
    writes: list[tuple[int, bytes]] = []
    rng = None if seed is None else np.random.default_rng(seed)
    for ini, nm in order:
        dims = _init_shape(nm, list(ini.dims), t, r)
        tp = onnx.TensorProto()
        tp.name, tp.data_type = nm, ini.data_type
        tp.dims.extend(dims)
        np_dtype = onnx.helper.tensor_dtype_to_np_dtype(ini.data_type)
        nbytes = int(np.prod(dims)) * np.dtype(np_dtype).itemsize
        vals = _cache_values(nm, r)
        if vals is None and re.search(r"norm(_layernorm)?\.weight$", nm):
            vals = np.ones(dims, np.float32)
        if vals is None and rng is not None:
            vals = _random_weight(rng, nm, dims, np_dtype)
        if vals is not None:
            assert list(vals.shape) == dims, (nm, vals.shape, dims)
            writes.append((offset, vals.astype(np_dtype).tobytes()))
        tp.data_location = TensorProto.EXTERNAL
        for k, v in (("location", data_path.name), ("offset", str(offset)), ("length", str(nbytes))):
            e = tp.external_data.add()
            e.key, e.value = k, v
        new_inits.append(tp)
        offset += nbytes
    del g.initializer[:]
    g.initializer.extend(new_inits)
    if data_path.exists():
        data_path.unlink()
    with open(data_path, "wb") as f:
        for off, buf in writes:
            f.seek(off)
            f.write(buf)
        f.truncate(offset)

    # 5. graph inputs / outputs (past/present per layer) and value_info
    def io_list(values, prefix):
        out = []
        for v in values:
            m = re.match(rf"^{prefix}\.(\d+)\.(key|value)$", v.name)
            if m:
                if int(m.group(1)) != 0:
                    continue
                for i in range(N):
                    nv = copy.deepcopy(v)
                    nv.name = f"{prefix}.{i}.{m.group(2)}"
                    d = nv.type.tensor_type.shape.dim
                    assert d[1].dim_value == t.kv_heads
                    d[1].dim_value = r.kv_heads
                    out.append(nv)
            else:
                nv = copy.deepcopy(v)
                _resize_vi(nv, t, r)
                out.append(nv)
        return out
    ins, outs = io_list(g.input, "past_key_values"), io_list(g.output, "present")
    del g.input[:]
    g.input.extend(ins)
    del g.output[:]
    g.output.extend(outs)

    vis_by_layer: dict[int | None, list] = {}
    for vi in g.value_info:
        m = re.search(r"/model/layers\.(\d+)/|model\.layers\.(\d+)\.", vi.name)
        li = int(m.group(1) or m.group(2)) if m else None
        vis_by_layer.setdefault(li, []).append(vi)
    new_vis = []
    init_shapes = {i.name: list(i.dims) for i in new_inits}
    for li, vis in sorted(vis_by_layer.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
        if li is None or li == 0:
            targets = [(vis, same)]
        elif li == TL - 1:
            targets = [(vis, _renamer({TL - 1: i, TL - 2: i - 1}, const_names)) for i in range(1, N)]
        elif li == TL:
            targets = [(vis, fin)]
        else:
            continue
        for vlist, rn in targets:
            for vi in vlist:
                nv = copy.deepcopy(vi)
                nv.name = rn(vi.name)
                if nv.name in init_shapes:
                    d = nv.type.tensor_type.shape.dim
                    for dd, val in zip(d, init_shapes[nv.name]):
                        dd.Clear()
                        dd.dim_value = val
                elif not _resize_vi(nv, t, r):
                    continue
                new_vis.append(nv)
    del g.value_info[:]
    g.value_info.extend(new_vis)


def _random_weight(rng: np.random.Generator, name: str, dims: list[int], dtype) -> np.ndarray:
    """A weight with real numbers, of the size a fresh Hugging Face checkpoint has (its initializer_range 0.02, which
    the corpus's tiny builds have): N(0, 0.02); int4: uniform codes (any byte) times scales of 0.003..0.006 (std
    ~0.02)."""
    if np.dtype(dtype) == np.uint8:
        return rng.integers(0, 256, size=dims, dtype=np.uint8)
    if name.endswith("_scales"):
        return rng.uniform(0.003, 0.006, size=dims).astype(np.float32)
    return (rng.standard_normal(dims) * 0.02).astype(np.float32)


def _resize_vi(vi: onnx.ValueInfoProto, t: Config, r: Config) -> bool:
    d = vi.type.tensor_type.shape.dim
    dims = [x.dim_value if x.HasField("dim_value") else x.dim_param for x in d]
    if vi.name in ("cos_cache", "sin_cache") and all(isinstance(x, str) for x in dims):
        return True
    new = _value_dims(vi.name, dims, t, r)
    if new is None:
        return False
    for x, v in zip(d, new):
        if isinstance(v, int):
            x.dim_value = v
    return True


def _write_genai_config(source: Path, out: Path, r: Config) -> None:
    gc = json.loads((source / "genai_config.json").read_text())
    model = gc["model"]
    dec = model["decoder"]
    dec.update(head_size=r.head, hidden_size=r.hidden, num_attention_heads=r.heads, num_hidden_layers=r.layers,
               num_key_value_heads=r.kv_heads)
    model["vocab_size"] = r.vocab
    model["context_length"] = r.context
    gc.get("search", {})["max_length"] = r.context
    for po in dec.get("session_options", {}).get("provider_options", []):
        for opts in po.values():
            if "multiRotaryCacheConcatOffset" in opts:
                opts["multiRotaryCacheConcatOffset"] = str(r.original_context)
    (out / "genai_config.json").write_text(json.dumps(gc, indent=4) + "\n")


# ------------------------------------------------------------------------------------------------ helpers

def apparent_size(folder: str | os.PathLike) -> int:
    """Bytes the folder claims (what a non-sparse copy would write)."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def disk_usage(folder: str | os.PathLike) -> int:
    """Bytes the folder really takes on disk (sparse holes excluded)."""
    return sum(p.stat().st_blocks * 512 for p in Path(folder).rglob("*") if p.is_file())


def op_histogram(model_path: str | os.PathLike) -> dict[str, int]:
    m = onnx.load(str(model_path), load_external_data=False)
    h: dict[str, int] = {}
    for n in m.graph.node:
        k = f"{n.domain}::{n.op_type}" if n.domain else n.op_type
        h[k] = h.get(k, 0) + 1
    return dict(sorted(h.items()))


#: ops onnxruntime registers in the ONNX domain that onnx.checker does not know (the real builder output fails
#: the checker on them too); check() looks at them as com.microsoft ops, which the checker skips.
ORT_ONNX_DOMAIN_OPS = {"SimplifiedLayerNormalization"}


def check(folder: str | os.PathLike) -> None:
    """onnx.checker on the graph (external data references checked for existence, never loaded)."""
    folder = Path(folder).resolve()
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    for n in model.graph.node:
        if n.op_type in ORT_ONNX_DOMAIN_OPS and n.domain in ("", "ai.onnx"):
            n.domain = "com.microsoft"
    cwd = os.getcwd()
    os.chdir(folder)  # external data paths are relative to the model
    try:
        onnx.checker.check_model(model)
    finally:
        os.chdir(cwd)


def smoke(out: str | os.PathLike | None = None, layers: int = 2, context: int = 256) -> dict[str, Path]:
    """Every model at ``layers`` layers and a ``context``-row cache (CI-sized; a few seconds). Returns the folders.

    Sparse data is still at the real per-layer width (7B 2-layer ~2-3 GB apparent, 0 on disk).
    """
    import tempfile
    root = Path(out) if out else Path(tempfile.mkdtemp(prefix="realsize-smoke-"))
    folders = {}
    for name in MODELS:
        folders[name] = build(name, root / name, layers=layers, context=context)
        check(folders[name])
    return folders


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", nargs="?", help="model name (--list)")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--context", type=int)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--smoke", metavar="DIR")
    args = ap.parse_args(argv)
    if args.list or not (args.name or args.smoke):
        for m in MODELS.values():
            print(f"{m.name:<22} {m.description}")
        return 0
    if args.smoke:
        start = time.perf_counter()
        for name, folder in smoke(args.smoke).items():
            print(f"{name:<22} {apparent_size(folder) / 1e9:7.2f} GB apparent  {folder}")
        print(f"smoke: {time.perf_counter() - start:.1f} s")
        return 0
    start = time.perf_counter()
    folder = build(args.name, args.out, layers=args.layers, context=args.context)
    check(folder)
    print(f"{folder}: {apparent_size(folder) / 1e9:.2f} GB apparent, {disk_usage(folder) / 1e6:.1f} MB on disk, "
          f"built in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
