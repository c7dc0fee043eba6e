"""The embedded default model and the demo job (``rope-passes demo``).

``build_tiny_decoder`` writes a small genai-style decoder folder in code, no download: the same structure
onnxruntime-genai's builder emits for Llama without ``enable_webgpu_graph`` (packed-QKV GroupQueryAttention with
fused RoPE, ``cos_cache``/``sin_cache`` initializers, and ``total_sequence_length`` from ``Shape(attention_mask)``, which
blocks WebGPU graph capture), with ``genai_config.json`` and external weights beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: The tiny model's shape. vocab 512 > 492: the checker feeds the corpus token ids randint(4, 492).
TINY = dict(vocab=512, hidden=64, heads=4, kv_heads=2, head=16, layers=2, context=128, theta=10000.0, seed=7)


def rope_tables(context: int, rotary_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [context, rotary_dim/2] for plain 1D RoPE."""
    inv_freq = 1.0 / (theta ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))
    angles = np.outer(np.arange(context, dtype=np.float64), inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def build_tiny_decoder_model(cfg: dict | None = None) -> onnx.ModelProto:
    c = dict(TINY, **(cfg or {}))
    rng = np.random.default_rng(c["seed"])
    hidden, heads, kvh, hd = c["hidden"], c["heads"], c["kv_heads"], c["head"]
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def weight(name: str, shape: tuple[int, ...], scale: float = 0.08) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def const(name: str, array: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(array, name))
        return name

    cos, sin = rope_tables(c["context"], hd, c["theta"])
    const("cos_cache", cos)
    const("sin_cache", sin)
    const("one_i64", np.array([1], np.int64))
    const("idx1_i64", np.array(1, np.int64))
    weight("model.embed_tokens.weight", (c["vocab"], hidden), 0.5)

    # attention mask → seqlens_k (ReduceSum - 1) and total_sequence_length (Shape[1]): the builder's non-graph form
    m = "/model/attn_mask_reformat/attn_mask_subgraph"
    nodes += [
        helper.make_node("ReduceSum", ["attention_mask", "one_i64"], [f"{m}/ReduceSum/output_0"], f"{m}/ReduceSum",
                         keepdims=0),
        helper.make_node("Sub", [f"{m}/ReduceSum/output_0", "one_i64"], [f"{m}/Sub/output_0"], f"{m}/Sub"),
        helper.make_node("Cast", [f"{m}/Sub/output_0"], ["seqlens_k"], f"{m}/Sub/Cast", to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], [f"{m}/Shape/output_0"], f"{m}/Shape"),
        helper.make_node("Gather", [f"{m}/Shape/output_0", "idx1_i64"], [f"{m}/Gather/output_0"], f"{m}/Gather",
                         axis=0),
        helper.make_node("Cast", [f"{m}/Gather/output_0"], ["total_seq_len"], f"{m}/Gather/Cast",
                         to=TensorProto.INT32),
        helper.make_node("Gather", ["model.embed_tokens.weight", "input_ids"], ["h0"], "/model/embed_tokens/Gather"),
    ]
    x = "h0"
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", c["vocab"]])]
    for i in range(c["layers"]):
        p = f"/model/layers.{i}"
        ln1 = weight(f"model.layers.{i}.input_layernorm.weight", (hidden,), 0.1)
        inits[-1] = numpy_helper.from_array(1.0 + numpy_helper.to_array(inits[-1]), ln1)
        nodes.append(helper.make_node("SimplifiedLayerNormalization", [x, ln1], [f"{p}/ln1"], f"{p}/input_layernorm",
                                      axis=-1, epsilon=1e-6, stash_type=1))
        qkv_w = weight(f"model.layers.{i}.attn.qkv_proj.weight", (hidden, (heads + 2 * kvh) * hd))
        nodes.append(helper.make_node("MatMul", [f"{p}/ln1", qkv_w], [f"{p}/qkv"], f"{p}/attn/qkv_proj/MatMul"))
        nodes.append(helper.make_node(
            "GroupQueryAttention",
            [f"{p}/qkv", "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value", "seqlens_k",
             "total_seq_len", "cos_cache", "sin_cache"],
            [f"{p}/attn_out", f"present.{i}.key", f"present.{i}.value"],
            f"{p}/attn/GroupQueryAttention", domain="com.microsoft",
            num_heads=heads, kv_num_heads=kvh, scale=float(1 / np.sqrt(hd)), do_rotary=1, rotary_interleaved=0,
            local_window_size=-1, softcap=0.0,
        ))
        o_w = weight(f"model.layers.{i}.attn.o_proj.weight", (heads * hd, hidden))
        nodes.append(helper.make_node("MatMul", [f"{p}/attn_out", o_w], [f"{p}/o"], f"{p}/attn/o_proj/MatMul"))
        nodes.append(helper.make_node("Add", [x, f"{p}/o"], [f"{p}/res1"], f"{p}/residual1"))
        ln2 = weight(f"model.layers.{i}.post_attention_layernorm.weight", (hidden,), 0.1)
        inits[-1] = numpy_helper.from_array(1.0 + numpy_helper.to_array(inits[-1]), ln2)
        nodes.append(helper.make_node("SimplifiedLayerNormalization", [f"{p}/res1", ln2], [f"{p}/ln2"],
                                      f"{p}/post_attention_layernorm", axis=-1, epsilon=1e-6, stash_type=1))
        up = weight(f"model.layers.{i}.mlp.up_proj.weight", (hidden, 2 * hidden))
        down = weight(f"model.layers.{i}.mlp.down_proj.weight", (2 * hidden, hidden))
        nodes += [
            helper.make_node("MatMul", [f"{p}/ln2", up], [f"{p}/up"], f"{p}/mlp/up_proj/MatMul"),
            helper.make_node("Sigmoid", [f"{p}/up"], [f"{p}/sig"], f"{p}/mlp/act/Sigmoid"),
            helper.make_node("Mul", [f"{p}/up", f"{p}/sig"], [f"{p}/act"], f"{p}/mlp/act/Mul"),
            helper.make_node("MatMul", [f"{p}/act", down], [f"{p}/down"], f"{p}/mlp/down_proj/MatMul"),
            helper.make_node("Add", [f"{p}/res1", f"{p}/down"], [f"{p}/out"], f"{p}/residual2"),
        ]
        x = f"{p}/out"
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", TensorProto.FLOAT,
                                                        ["batch_size", kvh, "past_sequence_length", hd]))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", TensorProto.FLOAT,
                                                         ["batch_size", kvh, "total_sequence_length", hd]))
    lnf = weight("model.norm.weight", (hidden,), 0.1)
    inits[-1] = numpy_helper.from_array(1.0 + numpy_helper.to_array(inits[-1]), lnf)
    nodes.append(helper.make_node("SimplifiedLayerNormalization", [x, lnf], ["final"], "/model/norm",
                                  axis=-1, epsilon=1e-6, stash_type=1))
    lm = weight("lm_head.weight", (hidden, c["vocab"]))
    nodes.append(helper.make_node("MatMul", ["final", lm], ["logits"], "/lm_head/MatMul"))
    graph = helper.make_graph(nodes, "tiny_decoder", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              producer_name="rope_passes.demo")
    model.ir_version = 10
    helper.set_model_props(model, {"rope_passes.demo": "tiny llama-style decoder"})
    return model


def genai_config(cfg: dict | None = None) -> dict:
    c = dict(TINY, **(cfg or {}))
    return {
        "model": {
            "bos_token_id": 1, "context_length": c["context"], "eos_token_id": 2, "pad_token_id": 0,
            "type": "llama", "vocab_size": c["vocab"],
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "model.onnx", "head_size": c["head"], "hidden_size": c["hidden"],
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
                "num_attention_heads": c["heads"], "num_hidden_layers": c["layers"], "num_key_value_heads": c["kv_heads"],
            },
        },
        "search": {"max_length": c["context"], "past_present_share_buffer": True, "do_sample": False},
    }


def build_tiny_decoder(folder: str | Path, cfg: dict | None = None) -> Path:
    """Write the tiny decoder as a genai folder (model.onnx + model.onnx.data + genai_config.json); returns folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = build_tiny_decoder_model(cfg)
    onnx.save_model(model, folder / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=256)
    (folder / "genai_config.json").write_text(json.dumps(genai_config(cfg), indent=4) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({"note": "placeholder: the demo feeds token ids"}) + "\n")
    return folder
