"""Decoder inputs that mean something: a real prefill + single-token decode, fed to whatever inputs a graph declares.

The token sequence is the one the genai corpus's Hugging Face reference logits were computed from
(``numpy.random.RandomState(0).randint(4, 492, size=(1, S))``, attention mask all ones, positions ``0..S-1``), so the
CPU run of an fp32 builder graph reproduces ``ref_S8.npy``. Each graph gets exactly the inputs it declares, built from
that one token sequence:

* ``input_ids`` ``[B, S]``, or ``inputs_embeds`` ``[B, S, hidden]`` looked up in an embedding table (the table of a
  graph that embeds its own ids, or a fixed-seed random table, see :func:`default_embedding_table`);
* ``attention_mask`` ``[B, total]`` of ones;
* ``position_ids`` ``[B, S]`` or ``[3, B, S]`` (three identical axes: text-only mRoPE), ``past .. past+S-1``;
* ``past_key_values.*`` empty (``[B, kv_heads, 0, head]``) for the prefill, then the previous step's ``present.*``.

Step 0 is the prefill of ``prefill`` tokens; steps 1..N feed one token each. Two graphs with different input sets
(a rewrite that drops ``position_ids``) see the same tokens and positions.

    sess = create_session("model.onnx", "webgpu")
    spec = DecoderSpec.from_session(sess, genai_config)
    steps = run_decode(sess, spec, token_ids(8 + 4), prefill=8, steps=4)
    steps[0]["logits"].shape  # (1, 8, vocab); steps[1]["logits"].shape == (1, 1, vocab)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rope_passes.config import GenaiConfig
from rope_passes.errors import UsageError

#: Token ids of the corpus's Hugging Face references: RandomState(0).randint(TOKEN_LOW, TOKEN_HIGH).
TOKEN_LOW, TOKEN_HIGH = 4, 492
PAST_PREFIX, PRESENT_PREFIX = "past_key_values.", "present."

ORT_DTYPES: dict[str, np.dtype] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(double)": np.dtype(np.float64),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(bool)": np.dtype(np.bool_),
}


def numpy_dtype(ort_type: str) -> np.dtype | None:
    """The numpy dtype of an onnxruntime type string (None: one the checker cannot synthesise). bfloat16 has no numpy
    dtype of its own; onnx depends on ml_dtypes, which provides one, imported here on first use: importing it costs
    every run's subprocess about a second of CPU (ml_dtypes 0.7 on the CI machine), and few graphs have bfloat16."""
    if ort_type == "tensor(bfloat16)":
        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover
            return None
        return np.dtype(ml_dtypes.bfloat16)
    return ORT_DTYPES.get(ort_type)

#: onnx TensorProto element types -> onnxruntime type strings (for specs read from a model file).
_ONNX_TO_ORT = {1: "tensor(float)", 10: "tensor(float16)", 11: "tensor(double)", 7: "tensor(int64)",
                6: "tensor(int32)", 3: "tensor(int8)", 2: "tensor(uint8)", 9: "tensor(bool)", 16: "tensor(bfloat16)"}

#: the names of a sequence dimension (sequence_len: mobius-onnx)
SEQ_DIMS = frozenset({"sequence_length", "seq_len", "sequence", "sequence_len"})
DECODER_INPUTS = {"input_ids", "inputs_embeds", "attention_mask", "position_ids"}


def token_ids(total: int, seed: int = 0, vocab: int | None = None) -> np.ndarray:
    """The corpus's token sequence of ``total`` tokens, ``[1, total]`` int64 (a prefix of a longer one is the same);
    for a model whose vocabulary ``vocab`` (:func:`.plan.vocabulary`) is smaller than the corpus's ids, ids drawn across
    ``0..vocab-1`` instead (an id past the embedding table is no input the model accepts)."""
    low, high = id_range(vocab)
    return np.random.RandomState(seed).randint(low, high, size=(1, total)).astype(np.int64)


def id_range(vocab: int | None) -> tuple[int, int]:
    """``[low, high)`` of the ids the decode and the sweep draw: the corpus's where they fit the vocabulary, else
    the whole vocabulary."""
    if vocab is None or vocab >= TOKEN_HIGH:
        return TOKEN_LOW, TOKEN_HIGH
    return 0, max(1, vocab)


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One graph input as onnxruntime declares it: dims are ints, symbolic names (str) or None."""

    name: str
    type: str  # onnxruntime spelling, e.g. "tensor(float16)"
    shape: tuple[int | str | None, ...]

    @property
    def dtype(self) -> np.dtype:
        dtype = numpy_dtype(self.type)
        if dtype is None:
            raise UsageError(f"input {self.name!r} has type {self.type}, which the checker cannot synthesise")
        return dtype


def _specs_from_model(model: Any) -> tuple[list[InputSpec], list[str]]:
    import onnx

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    init = {t.name for t in model.graph.initializer}
    ins = []
    for v in model.graph.input:
        if v.name in init:
            continue
        tt = v.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
        ins.append(InputSpec(v.name, _ONNX_TO_ORT.get(tt.elem_type, f"elem_type({tt.elem_type})"), dims))
    return ins, [o.name for o in model.graph.output]


@dataclasses.dataclass
class DecoderSpec:
    """What a graph declares, plus the sizes needed to synthesise its inputs."""

    inputs: list[InputSpec]
    outputs: list[str]
    head_size: int | None = None  # from genai_config.json when the graph's dims are symbolic
    dims: dict[str, int] = dataclasses.field(default_factory=dict)  # user-given sizes for symbolic dims
    embedding_table: np.ndarray | None = None  # [vocab, hidden] for inputs_embeds graphs
    vocab: int | None = None  # ids below this are valid (.plan.vocabulary); None: the corpus's ids

    @classmethod
    def from_session(cls, sess: Any, genai_config: GenaiConfig | Mapping | None = None, **kw: Any) -> DecoderSpec:
        ins = [InputSpec(i.name, i.type, tuple(i.shape)) for i in sess.get_inputs()]
        return cls(ins, [o.name for o in sess.get_outputs()], head_size=_head_size(genai_config), **kw)

    @classmethod
    def from_model(cls, model: Any, genai_config: GenaiConfig | Mapping | None = None, **kw: Any) -> DecoderSpec:
        """From an ``onnx.ModelProto`` or a model path (weights are not read)."""
        ins, outs = _specs_from_model(model)
        return cls(ins, outs, head_size=_head_size(genai_config), **kw)

    @property
    def names(self) -> list[str]:
        return [i.name for i in self.inputs]

    @property
    def is_decoder(self) -> bool:
        """True for LLM decoder graphs: ids or embeddings plus an attention mask (a KV cache is optional)."""
        names = set(self.names)
        return bool(names & {"input_ids", "inputs_embeds"}) and "attention_mask" in names

    @property
    def cacheless(self) -> bool:
        """A decoder without a KV cache (an exporter's prefill graph): every call is the whole sequence."""
        return not self.past_names

    @property
    def past_names(self) -> list[str]:
        return [n for n in self.names if n.startswith(PAST_PREFIX)]

    def present_name(self, past: str) -> str:
        return PRESENT_PREFIX + past[len(PAST_PREFIX):]

    def input(self, name: str) -> InputSpec | None:
        return next((i for i in self.inputs if i.name == name), None)

    def output_shape(self, name: str, declared: Sequence[Any], seq: int) -> list[int]:
        """The shape of output ``name`` (``declared``: its dims, ints or names) for a call of ``seq`` tokens of one
        row: what a graph-capture buffer for it is allocated with (every capture driver's)."""
        shape = []
        for d in declared:
            if isinstance(d, int) and d > 0:
                shape.append(d)
            elif d in ("batch_size", "batch"):
                shape.append(1)
            elif d in SEQ_DIMS:
                shape.append(seq)
            elif isinstance(d, str) and d in self.dims:
                shape.append(self.dims[d])
            else:
                raise UsageError(f"cannot size output {name} dimension {d!r} for graph capture: give --dim {d}=N")
        return shape


def _head_size(genai_config: GenaiConfig | Mapping | None) -> int | None:
    if isinstance(genai_config, GenaiConfig):
        return genai_config.head_size
    return GenaiConfig(dict(genai_config) if genai_config else None).head_size


def default_embedding_table(width: int, dtype: np.dtype | type = np.float32, seed: int = 0) -> np.ndarray:
    """A fixed-seed ``[TOKEN_HIGH, width]`` table, N(0, 0.02) like a fresh HF ``embed_tokens`` (same for all graphs)."""
    table = np.random.RandomState(seed).standard_normal((TOKEN_HIGH, width)) * 0.02
    return table.astype(dtype)


def embedding_table(model: str | Path) -> np.ndarray | None:
    """The token embedding table of a graph that embeds its own ``input_ids`` (a ``Gather(table, input_ids)``).

    Used to feed an ``inputs_embeds`` graph the embeddings its ``input_ids`` sibling computes, e.g. the corpus's
    ``current/qwen25_vl/cpu_fp32`` table for ``legacy/qwen25_vl/cpu_fp32``: the checkpoint's own embeddings, which is
    what the Hugging Face reference logits used. A ``.npy`` file is read as the table itself.
    """
    path = Path(model)
    if path.suffix == ".npy":
        return np.load(path)
    import onnx_ir as ir

    from rope_passes.io import load_model

    m = load_model(path)
    for node in ir.traversal.RecursiveGraphIterator(m.graph):
        if node.op_type != "Gather" or len(node.inputs) < 2 or node.inputs[1] is None:
            continue
        if node.inputs[1].name != "input_ids" or node.inputs[0] is None:
            continue
        tensor = node.inputs[0].const_value
        if tensor is not None:
            return np.asarray(tensor.numpy())
    return None


def _dim(spec: InputSpec, axis: int, known: Mapping[str, int], what: str) -> int:
    d = spec.shape[axis] if axis < len(spec.shape) else None
    if isinstance(d, int) and d > 0:
        return d
    if isinstance(d, str) and d in known:
        return int(known[d])
    raise UsageError(
        f"cannot size {spec.name} axis {axis} ({d or '?'}, the {what}): give it with --dim {d or 'NAME'}=VALUE"
    )


def past_shape(spec: DecoderSpec, i: InputSpec, batch: int, rows: int) -> tuple[int, int, int, int]:
    """``[batch, kv_heads, rows, head]`` for the past input ``i`` (the head size from genai_config when symbolic)."""
    known = dict(spec.dims)
    if spec.head_size and isinstance(i.shape[3], str):
        known.setdefault(i.shape[3], spec.head_size)
    return batch, _dim(i, 1, spec.dims, "number of KV heads"), rows, _dim(i, 3, known, "head size")


def step_feeds(
    spec: DecoderSpec,
    tokens: np.ndarray,
    past_len: int,
    past: Mapping[str, np.ndarray] | None = None,
    mask: np.ndarray | None = None,
    positions: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The feeds for one call that processes ``tokens`` (``[B, S]``) after ``past_len`` cached tokens.

    ``past`` maps ``past_key_values.*`` to the previous ``present.*`` (None: empty cache, for the prefill).
    ``mask`` (``[B, past_len + S]``) and ``positions`` (``[B, S]``): a padded batch's attention mask and position ids
    (:mod:`.schedules`); default all ones and ``past_len .. past_len + S - 1`` on every row.
    """
    seq = tokens.shape[1]
    total = past_len + seq
    feeds: dict[str, np.ndarray] = {}
    for i in spec.inputs:
        name, dtype = i.name, i.dtype
        if name == "input_ids":
            feeds[name] = tokens.astype(dtype)
        elif name == "inputs_embeds":
            width = _dim(i, 2, spec.dims, "hidden size")
            table = spec.embedding_table
            if table is None:
                table = default_embedding_table(width)
            if table.shape[-1] != width:
                raise UsageError(f"the embedding table is {table.shape[-1]} wide but {name} takes {width}")
            feeds[name] = table[tokens].astype(dtype)
        elif name == "attention_mask":
            feeds[name] = np.ones((tokens.shape[0], total), dtype) if mask is None else mask.astype(dtype)
        elif name == "position_ids":
            pos = np.broadcast_to(np.arange(past_len, total, dtype=dtype) if positions is None
                                  else positions.astype(dtype), tokens.shape)
            if len(i.shape) == 3:  # [3, B, S]: text-only mRoPE, three identical axes
                pos = np.broadcast_to(pos, (i.shape[0] if isinstance(i.shape[0], int) else 3, *tokens.shape))
            feeds[name] = np.ascontiguousarray(pos)
        elif name.startswith(PAST_PREFIX):
            if past is not None and name in past:
                feeds[name] = past[name]
            else:
                if past_len:
                    raise UsageError(f"no cache for {name} at past length {past_len}")
                feeds[name] = np.zeros(past_shape(spec, i, tokens.shape[0], 0), dtype)
        else:
            raise UsageError(f"the decoder input {name!r} is not one the checker knows how to synthesise")
    return feeds


def new_tokens(outs: dict[str, np.ndarray], past: int, tokens: int) -> dict[str, np.ndarray]:
    """A cache-less graph's outputs for a whole sequence as a cached call of ``tokens`` after ``past`` returns them:
    every ``[B, past + tokens, ...]`` output (logits) cut to its last ``tokens`` rows (``present.*`` kept whole)."""
    return {n: v[:, past:] if not n.startswith(PRESENT_PREFIX) and v.ndim >= 2 and v.shape[1] == past + tokens else v
            for n, v in outs.items()}


def keep_step(outs: dict[str, np.ndarray], past_len: int, last: bool) -> dict[str, np.ndarray]:
    """What a decode keeps of one call: every output, but ``present.*`` (``[B, kv_heads, total, head]``) only in
    the rows this call added unless it is the ``last`` call. The earlier rows are the call's past, fed back from
    the previous call (where they were kept), and the last call's full cache shows any later change to them: the
    same evidence in O(steps) memory, not O(steps²) (4096 steps of 2 real Phi-3 layers: ~400 GB otherwise)."""
    if last or past_len == 0:
        return outs
    return {n: np.ascontiguousarray(v[:, :, past_len:, :]) if n.startswith(PRESENT_PREFIX) and v.ndim == 4 else v
            for n, v in outs.items()}


def run_decode(
    session: Any,
    spec: DecoderSpec,
    tokens: np.ndarray,
    prefill: int,
    steps: int,
    on_step: Callable[[int], None] | None = None,
    results: list[dict[str, np.ndarray]] | None = None,
) -> list[dict[str, np.ndarray]]:
    """Prefill ``tokens[:, :prefill]``, then ``steps`` single-token steps; every output of every call, step 0 first
    (``present.*`` as :func:`keep_step` keeps it).

    ``present.*`` of a call is fed back as ``past_key_values.*`` of the next. ``tokens`` needs ``prefill + steps``
    columns (use :func:`token_ids`). Steps are appended to ``results`` when given, so a caller keeps the steps that
    ran before an exception.
    """
    if tokens.shape[1] < prefill + steps:
        raise UsageError(f"{tokens.shape[1]} tokens for a prefill of {prefill} and {steps} steps")
    results = [] if results is None else results
    past: dict[str, np.ndarray] | None = None
    past_len = 0
    for step in range(steps + 1):
        chunk = tokens[:, :prefill] if step == 0 else tokens[:, past_len:past_len + 1]
        if past_len and spec.cacheless:  # no KV cache: its client sends the whole sequence again (use_cache=False)
            outs = new_tokens(dict(zip(spec.outputs, session.run(spec.outputs, step_feeds(
                spec, tokens[:, :past_len + 1], 0, None)))), past_len, 1)
        else:
            outs = dict(zip(spec.outputs, session.run(spec.outputs, step_feeds(spec, chunk, past_len, past))))
        results.append(keep_step(outs, past_len, step == steps))
        past = {p: outs[spec.present_name(p)] for p in spec.past_names if spec.present_name(p) in outs}
        past_len += chunk.shape[1]
        if on_step is not None:
            on_step(step)
    return results


def random_feeds(spec: DecoderSpec, seed: int = 0) -> dict[str, np.ndarray]:
    """Fixed-seed inputs for a graph that is not a decoder: symbolic dims come from ``spec.dims`` (``--dim``)."""
    rng = np.random.RandomState(seed)
    feeds = {}
    for i in spec.inputs:
        shape = tuple(_dim(i, a, spec.dims, "symbolic dimension") for a in range(len(i.shape)))
        dtype = i.dtype
        if dtype.kind == "f" or dtype.name == "bfloat16":
            feeds[i.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[i.name] = rng.randint(0, 2, size=shape).astype(dtype)
        else:
            feeds[i.name] = rng.randint(0, 8, size=shape).astype(dtype)
    return feeds


def parse_dims(items: Sequence[str] | None) -> dict[str, int]:
    """``["batch=1", "seq=8"]`` -> ``{"batch": 1, "seq": 8}`` (the CLI's ``--dim name=value``)."""
    out = {}
    for item in items or ():
        m = re.fullmatch(r"\s*([^=\s]+)\s*=\s*(\d+)\s*", item)
        if not m:
            raise UsageError(f"--dim takes name=value with a positive integer value, got {item!r}")
        out[m.group(1)] = int(m.group(2))
    return out
