"""A sweep over the pass registry (every pass in ``ALL_PASSES``), as onnx_ir tests its own passes:

* each pass's constructor takes its options as typed keywords (``FoldTextMRoPEPass(ctx, text_only=True)``, which
  mypy checks at call sites), with the names, types and defaults of its ``options_type`` (which ``rope-passes
  passes`` prints): the two spellings cannot drift apart;
* each pass on an empty model: nothing to do, said as "not matched", the model unchanged;
* each pass run twice in a row: the second run changes nothing (on the tiny decoder for every pass, and on the
  corpus graphs the presets rewrite);
* each pass on a model with a local function: it runs, and the function is left as it was (no pass rewrites inside
  functions).
"""

from __future__ import annotations

import dataclasses
import inspect
import typing

import onnx_ir as ir
import pytest
from conftest import GENAI, TORCH
from onnx import TensorProto, helper

from rope_passes.demo import build_tiny_decoder
from rope_passes.io import load_bundle
from rope_passes.passes import ALL_PASSES, PassContext, RopePass
from rope_passes.plan import make_plan
from rope_passes.report import Outcome
from rope_passes.runtimes.descriptors import WEBGPU_127
from rope_passes.runtimes.probed import probed_runtime

NAMES = sorted(ALL_PASSES)


def _context(bundle=None) -> PassContext:
    if bundle is None:
        return PassContext(runtime=probed_runtime(WEBGPU_127))
    return PassContext(bundle.genai_config, model_path=bundle.model_path, runtime=probed_runtime(WEBGPU_127))


def _state(model: ir.Model) -> bytes:
    return ir.serde.serialize_model(model).SerializeToString(deterministic=True)


@pytest.mark.parametrize("name", NAMES)
def test_constructor_keywords_are_the_options(name):
    cls = ALL_PASSES[name]
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert params[0].name == "context" and params[0].default is None
    keywords = {p.name: p for p in params[1:]}
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in keywords.values()), f"{name}: options are keywords"
    assert not [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD], f"{name}: no **options"
    fields = {f.name: f for f in dataclasses.fields(cls.options_type)}
    assert set(keywords) == set(fields), name
    hints = typing.get_type_hints(cls.options_type)
    init_hints = typing.get_type_hints(cls.__init__)
    for key, field in fields.items():
        assert keywords[key].default == field.default, f"{name}.{key}: default"
        assert init_hints[key] == hints[key], f"{name}.{key}: type"
    made = cls(_context(), **{k: f.default for k, f in fields.items()})
    assert made.options == cls.options_type()


def test_a_typed_keyword_is_validated_like_an_option():
    from rope_passes.errors import UsageError
    from rope_passes.passes import FoldTextMRoPEPass, PrecomputeCosSinPass

    assert FoldTextMRoPEPass(_context(), text_only=True).options.text_only
    with pytest.raises(UsageError, match="precompute-cos-sin: max_positions must be a positive integer"):
        PrecomputeCosSinPass(_context(), max_positions=0)
    with pytest.raises(TypeError):
        ALL_PASSES["cleanup"](_context(), text_only=True)  # type: ignore[call-arg]


def _empty_model() -> ir.Model:
    graph = ir.Graph([], [], nodes=[], opset_imports={"": 21}, name="empty")
    return ir.Model(graph, ir_version=10)


@pytest.mark.parametrize("name", NAMES)
def test_every_pass_on_an_empty_model(name):
    model = _empty_model()
    before = _state(model)
    result = ALL_PASSES[name](_context())(model)
    assert not result.modified and _state(model) == before
    assert result.report is not None and not result.report.modified
    assert {f.outcome for f in result.report.findings} <= {Outcome.NOT_MATCHED, Outcome.NOTE}, result.report.findings


def _twice(model: ir.Model, cls: type[RopePass], context: PassContext, **options) -> None:
    first = cls(context, **options)(model)
    state = _state(first.model)
    second = cls(context, **options)(first.model)
    assert not second.modified, (cls.name, second.report.status if second.report else None)
    assert _state(second.model) == state, f"{cls.name}: the second run changed the graph"


@pytest.mark.parametrize("name", NAMES)
def test_every_pass_twice_on_the_tiny_decoder(name, tmp_path):
    bundle = load_bundle(build_tiny_decoder(tmp_path / "tiny"))
    options = {"max_positions": 64} if name == "precompute-cos-sin" else {}
    _twice(bundle.model, ALL_PASSES[name], _context(bundle), **options)


CORPUS = [(GENAI / "legacy/qwen25_vl/cpu_fp32", "webgpu-graph"),
          (GENAI / "current/phi3_mini_128k/cpu_fp32", "webgpu-graph"), (TORCH / "tf4/torchscript/llama/decode.onnx", "exporter")]


@pytest.mark.corpus
@pytest.mark.parametrize(("path", "preset"), CORPUS, ids=[c[0].parent.name + "/" + c[0].name for c in CORPUS])
def test_each_preset_pass_twice_on_a_corpus_graph(path, preset):
    """Each pass of the preset, in order, run twice: the second run changes nothing (the graph the preset leaves is
    the graph each pass accepts as done)."""
    bundle = load_bundle(path)
    options = {"text_only": True} if "qwen" in str(path) else {"max_positions": 256} if preset == "exporter" else {}
    plan = make_plan(preset, options=options, runtime=WEBGPU_127)
    context = _context(bundle)
    rewrote = []
    for name in plan.passes:
        first = ALL_PASSES[name].with_options(context, plan.options[name])(bundle.model)
        rewrote += [name] if first.modified else []
        state = _state(first.model)
        second = ALL_PASSES[name].with_options(context, plan.options[name])(first.model)
        assert not second.modified and _state(second.model) == state, (name, second.report.status)
        bundle.model = second.model
    assert rewrote, f"{path}: the preset rewrote nothing, so the sweep proved nothing"


def _model_with_a_function() -> ir.Model:
    """A main graph that calls a local function whose body has a Cos/Sin on positions (what precompute-cos-sin and
    the mRoPE passes look for in a main graph)."""
    body = [helper.make_node("Cast", ["p"], ["pf"], to=TensorProto.FLOAT),
            helper.make_node("Cos", ["pf"], ["c"]), helper.make_node("Sin", ["pf"], ["s"]),
            helper.make_node("Add", ["c", "s"], ["y"])]
    function = helper.make_function("local", "rot", ["p"], ["y"], body, [helper.make_opsetid("", 21)])
    graph = helper.make_graph([helper.make_node("rot", ["positions"], ["out"], "call", domain="local")], "g",
                              [helper.make_tensor_value_info("positions", TensorProto.INT64, [1, 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4])])
    proto = helper.make_model(graph, functions=[function], ir_version=10,
                              opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("local", 1)])
    return ir.from_proto(proto)


@pytest.mark.parametrize("name", NAMES)
def test_every_pass_on_a_model_with_a_function(name):
    model = _model_with_a_function()
    before = _state(model)
    options = {"max_positions": 16} if name == "precompute-cos-sin" else {}
    result = ALL_PASSES[name](_context(), **options)(model)
    assert not result.modified and _state(model) == before, (name, result.report.status if result.report else None)
