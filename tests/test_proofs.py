"""``rope_passes.proofs``: the one constant evaluator, the interval analysis, and proofs that read a model without
changing it. References: onnxruntime CPU running the same cone (the evaluator must agree with it on every constant
form), and exact integer arithmetic done by hand (the intervals).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from _utils import serialize
from onnx import parser

from rope_passes.proofs.constants import constant
from rope_passes.proofs.intervals import ANY_DIMS, FITS_INT32, Interval, Intervals
from rope_passes.runtime.sessions import create_session


def _model(body: str, inputs: str = "int64[N] x", outputs: str = "int64[M] y") -> ir.Model:
    text = f"""<ir_version: 10, opset_import: ["" : 20]>
    g ({inputs}) => ({outputs}) {{
        {body}
    }}"""
    model = ir.serde.deserialize_model(parser.parse_model(text))
    for node in model.graph:
        node.name = node.name or f"{node.op_type.lower()}_{node.outputs[0].name}"
    return model


def _value(model: ir.Model, name: str) -> ir.Value:
    return next(o for n in model.graph for o in n.outputs if o.name == name)


#: the same number -5, spelled every way a graph can spell it (the form must not matter)
MINUS_FIVE = {
    "value": "k = Constant <value = int64 {-5}> ()",
    "value_int": "k = Constant <value_int = -5> ()",
    "value_ints-gather": "ks = Constant <value_ints = [7, -5]> ()\n i = Constant <value = int64 {1}> ()\n"
                         "k = Gather <axis = 0> (ks, i)",
    "cast-from-float": "f = Constant <value_float = -5.0> ()\n k = Cast <to = 7> (f)",
    "gather-concat": "a = Constant <value = int64[1] {3}> ()\n b = Constant <value_ints = [-5]> ()\n"
                     "c = Concat <axis = 0> (a, b)\n i = Constant <value = int64 {1}> ()\n k = Gather <axis = 0> (c, i)",
    "arithmetic": "a = Constant <value_int = 10> ()\n b = Constant <value_int = 3> ()\n m = Mul (a, b)\n"
                  "t = Constant <value_int = 35> ()\n k = Sub (m, t)",
    "shape-of-constant": "z = Constant <value = int64[5] {0, 0, 0, 0, 0}> ()\n s = Shape (z)\n i = Constant <value = "
                         "int64 {0}> ()\n g = Gather <axis = 0> (s, i)\n k = Neg (g)",
}


@pytest.mark.parametrize("form", sorted(MINUS_FIVE))
def test_constant_evaluator_reads_every_form_as_its_value(form):
    model = _model(MINUS_FIVE[form] + "\n y = Add (x, k)")
    k = _value(model, "k")
    got = constant(k)
    assert got is not None and got.dtype == np.int64 and int(got.reshape(-1)[0]) == -5
    # the independent reference: onnxruntime runs the graph; y - x is the constant
    x = np.arange(4, dtype=np.int64)
    (y,) = create_session(serialize(model), "cpu").run(None, {"x": x})
    np.testing.assert_array_equal(y - x, np.full(4, int(got.reshape(-1)[0])))


def test_constant_evaluator_dtypes_of_constant_attributes():
    model = _model("a = Constant <value_float = 0.5> ()\n b = Constant <value_floats = [1.0, 2.0]> ()\n"
                   "c = Constant <value_ints = [1, 2]> ()\n y = Identity (x)")
    assert constant(_value(model, "a")).dtype == np.float32
    assert constant(_value(model, "b")).dtype == np.float32
    assert constant(_value(model, "c")).dtype == np.int64


def test_not_a_constant_when_the_cone_reads_an_input_or_an_overridable_initializer():
    model = _model("one = Constant <value_int = 1> ()\n s = Shape (x)\n y = Add (s, one)")
    assert constant(_value(model, "y")) is None  # Shape of a graph input: set per call
    assert constant(_value(model, "one")) is not None
    # an initializer that is also a graph input: the caller may feed another value
    over = ir.Value(name="over", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]),
                    const_value=ir.tensor(np.array(3, np.int64), name="over"))
    model.graph.initializers["over"] = over
    assert constant(over) is not None
    model.graph.inputs.append(over)
    assert constant(over) is None


def test_constant_evaluator_does_not_read_large_tensors():
    model = _model("n = Constant <value = int64[1] {100000000}> ()\n z = ConstantOfShape (n)\n y = Identity (x)")
    assert constant(_value(model, "z")) is None  # 10^8 elements: not evaluated at all
    assert constant(_value(model, "n")) is not None


def test_intervals_follow_arithmetic_and_wraparound():
    model = _model("""
        big = Constant <value_int = 4294967296> ()
        up = Add (x, big)
        back = Sub (up, big)
        s = Shape (x)
        zero = Constant <value_int = 0> ()
        one = Constant <value_int = 1> ()
        n = Gather <axis = 0> (s, zero)
        r = Range (zero, n, one)
        start = Constant <value_int = 3000000000> ()
        lim = Add (start, n)
        far = Range (start, lim, one)
        m = Mul (n, n)
        y = Concat <axis = 0> (back, r, far)
    """)
    iv = Intervals(FITS_INT32)
    int32 = Interval(-(2**31), 2**31 - 1)
    assert iv(_value(model, "up")) == Interval(2**32 - 2**31, 2**32 + 2**31 - 1)
    assert iv(_value(model, "back")) == int32  # left int32 and came back: exact in int64
    assert iv(_value(model, "r")) == Interval(0, 2**31 - 2)
    assert iv(_value(model, "far")).lo == 3_000_000_000 and not iv(_value(model, "far")).fits_int32()
    assert not iv(_value(model, "m")).fits_int32()  # n * n: up to 2^62
    assert iv(_value(model, "y")).lo == -(2**31)
    assert Intervals(ANY_DIMS)(_value(model, "back")).lo == -np.inf  # no assumption on x: nothing known


def test_interval_of_a_value_wrapping_in_int32_is_unbounded():
    model = _model("""
        c = Cast <to = 6> (x)
        big = Constant <value = int32 {2000000000}> ()
        w = Add (c, big)
        y = Cast <to = 7> (w)
    """)
    assert Intervals(FITS_INT32)(_value(model, "w")).lo == -np.inf  # int32 Add that may wrap


# ----------------------------------------------------------------------------------------------------------------
# Reading a model for a proof never changes it
# ----------------------------------------------------------------------------------------------------------------
def _range_chain_model() -> ir.Model:
    """optimum-style positions made by Range(past, past + S), a cos/sin chain, and a reader of the Range output
    named like a rewrite's node (the old ``typed`` kept the type it gave when such a reader existed)."""
    return _model("""
        inv = Constant <value = float[2] {1.0, 0.01}> ()
        shp = Shape (past_key)
        i2 = Constant <value = int64 {2}> ()
        past = Gather <axis = 0> (shp, i2)
        ids = Shape (input_ids)
        i1 = Constant <value = int64 {1}> ()
        s = Gather <axis = 0> (ids, i1)
        lim = Add (past, s)
        one = Constant <value = int64 {1}> ()
        r = Range (past, lim, one)
        z = Constant <value = int64[1] {0}> ()
        p1 = Unsqueeze (r, z)
        a2 = Constant <value = int64[1] {2}> ()
        p2 = Unsqueeze (p1, a2)
        f = Cast <to = 1> (p2)
        fr = Mul (f, inv)
        emb = Concat <axis = -1> (fr, fr)
        c = Cos (emb)
        si = Sin (emb)
        a1 = Constant <value = int64[1] {1}> ()
        cos_out = Unsqueeze (c, a1)
        sin_out = Unsqueeze (si, a1)
        ro = Identity (r)
    """, inputs="int64[B, S] input_ids, float[B, 2, P, 4] past_key",
        outputs="float[1, 1, S, 4] cos_out, float[1, 1, S, 4] sin_out, int64[S] ro")


def test_reading_a_chain_and_its_rows_does_not_retype_the_model():
    from rope_passes.proofs.chain import find_chain
    from rope_passes.proofs.config import rows_of

    model = _range_chain_model()
    next(n for n in model.graph if n.op_type == "Identity").name = "rope_passes/reader"
    r = _value(model, "r")
    assert r.type is None and r.shape is None
    before = serialize(model)
    cos = next(n for n in model.graph if n.op_type == "Cos")
    chain = find_chain(model, cos)
    assert chain.source is not None and chain.source.node is r.producer()
    rows = rows_of(model, chain, 8)
    np.testing.assert_allclose(rows[:, 0], np.cos(np.arange(8, dtype=np.float32)), rtol=1e-6)
    assert r.type is None and r.shape is None
    assert serialize(model) == before


# ----------------------------------------------------------------------------------------------------------------
# A malformed Hugging Face config is the user's input: one line, exit 2 (never an internal error)
# ----------------------------------------------------------------------------------------------------------------
FIXTURES = __import__("pathlib").Path(__file__).parent / "fixtures"


def _malformed(tmp, edit) -> tuple:
    import json
    import shutil

    folder = tmp / "model"
    folder.mkdir()
    shutil.copy(FIXTURES / "torch" / "tf4" / "optimum" / "phi3_longrope" / "decode.onnx", folder / "model.onnx")
    config = json.loads((FIXTURES / "hf_rope" / "tf4" / "phi3_longrope" / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder / "model.onnx", folder / "config.json"


@pytest.mark.corpus
@pytest.mark.parametrize(("case", "edit", "says"), [
    ("short-factor-3-of-8", lambda c: c["rope_scaling"].update(short_factor=[1.0, 1.05, 1.1]),
     "malformed LongRoPE short_factor: 3 numbers, but rotary dim 16 needs 8 positive numbers"),
    ("long-factor-not-numbers", lambda c: c["rope_scaling"].update(long_factor=["x"] * 8),
     "malformed LongRoPE long_factor: not numbers"),
    ("long-factor-zero", lambda c: c["rope_scaling"].update(long_factor=[0.0] * 8),
     "malformed LongRoPE long_factor: 8 numbers, but rotary dim 16 needs 8 positive numbers"),
    ("theta-zero", lambda c: c.update(rope_theta=0.0), "malformed rope: theta 0.0"),
])
def test_malformed_hf_config_is_one_line_exit_2(tmp_path, case, edit, says):
    import subprocess
    import sys

    model, config = _malformed(tmp_path, edit)
    proc = subprocess.run([sys.executable, "-m", "rope_passes", "optimize", str(model), "-o", str(tmp_path / "o.onnx"),
                           "--target", "exporter", "--max-positions", "128"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rope-passes: error: ") and says in lines[0], proc.stderr
    assert str(config) in lines[0]
    # lint: a finding (RP403), not a crash
    from rope_passes.lint import lint_bundle
    found = lint_bundle(str(model), select=["RP401", "RP402", "RP403"])
    assert [d.code for d in found] == ["RP403"] and says in found[0].message


def test_a_product_of_one_tensors_dims_is_bounded_by_its_element_count():
    """``Range(0, batch * seq)`` (builder 0.15's mRoPE token index) fits int32: batch * seq is part of the element
    count of one tensor (at most 2^31 - 1, the documented assumption); the product of two different tensors' dims,
    or of one dim with itself, is not."""
    model = _model("""
        s = Shape (h)
        zero = Constant <value = int64 {0}> ()
        one = Constant <value = int64 {1}> ()
        b = Gather <axis = 0> (s, zero)
        t = Gather <axis = 0> (s, one)
        bt = Mul (b, t)
        r = Range (zero, bt, one)
        bb = Mul (b, b)
        s2 = Shape (x)
        n = Gather <axis = 0> (s2, zero)
        bn = Mul (b, n)
        y = Concat <axis = 0> (r, bb, bn)
    """, inputs="int64[N] x, float[B, S, 8] h")
    iv = Intervals(FITS_INT32)
    assert iv(_value(model, "bt")) == Interval(0, 2**31 - 1)
    assert iv(_value(model, "r")).fits_int32()
    assert not iv(_value(model, "bb")).fits_int32()  # b * b: not an element count
    assert not iv(_value(model, "bn")).fits_int32()  # dims of two tensors


def test_reduceprod_of_a_run_of_one_shape_is_bounded_by_its_element_count():
    """lower-mrope's token index ``Range(0, ReduceProd(Shape(pos, start=1, end=3)))`` (and the opset < 15 form,
    ``Slice(Shape(pos), [1], [3])``) fits int32 like ``batch * seq`` does; a ReduceProd of two tensors' shapes, or of
    a Shape sliced by steps, is not proved."""
    model = _model("""
        zero = Constant <value = int64 {0}> ()
        one = Constant <value = int64 {1}> ()
        bs = Shape <start = 1, end = 3> (pos)
        n = ReduceProd <keepdims = 0> (bs)
        r = Range (zero, n, one)
        whole = Shape (pos)
        st = Constant <value = int64[1] {1}> ()
        en = Constant <value = int64[1] {3}> ()
        sl = Slice (whole, st, en)
        n2 = ReduceProd <keepdims = 0> (sl)
        two = Constant <value = int64[1] {2}> ()
        stepped = Slice (whole, zero1, en, zero1, two)
        n3 = ReduceProd <keepdims = 0> (stepped)
        both = Concat <axis = 0> (bs, xs)
        n4 = ReduceProd <keepdims = 0> (both)
        xs = Shape (x)
        zero1 = Constant <value = int64[1] {0}> ()
        y = Concat <axis = 0> (r, n2, n3, n4)
    """, inputs="int64[N] x, int64[3, B, S] pos")
    iv = Intervals(FITS_INT32)
    assert iv(_value(model, "n")) == Interval(0, 2**31 - 1) and iv(_value(model, "r")).fits_int32()
    assert iv(_value(model, "n2")) == Interval(0, 2**31 - 1)
    assert not iv(_value(model, "n3")).fits_int32()  # every other dim: not a run (stepped)
    assert not iv(_value(model, "n4")).fits_int32()  # two tensors' shapes


# ----------------------------------------------------------------------------------------------------------------
# Positions made by a Range: proved by value
# ----------------------------------------------------------------------------------------------------------------
def _range_with_start(start_body: str) -> tuple[ir.Model, ir.Node]:
    model = _model(f"""
        rshp = Shape (past_key)
        ri2 = Constant <value = int64 {{2}}> ()
        past = Gather <axis = 0> (rshp, ri2)
        rids = Shape (input_ids)
        ri1 = Constant <value = int64 {{1}}> ()
        rlen = Gather <axis = 0> (rids, ri1)
        {start_body}
        rlim = Add (start, rlen)
        rone = Constant <value_int = 1> ()
        r = Range (start, rlim, rone)
        rf = Cast <to = 1> (r)
        rinv = Constant <value = float {{0.5}}> ()
        rprod = Mul (rf, rinv)
        y = Cos (rprod)
    """, inputs="int64[B, S] input_ids, float[B, 2, P, 4] past_key", outputs="float[S] y")
    return model, next(n for n in model.graph if n.outputs[0].name == "rprod")


@pytest.mark.parametrize("form", sorted(MINUS_FIVE))
def test_a_range_start_below_zero_is_refused_in_every_form(form):
    from rope_passes.proofs.positions import range_source
    from rope_passes.report import MatchFailure

    model, product = _range_with_start(MINUS_FIVE[form] + "\n start = Add (past, k)")
    with pytest.raises(MatchFailure) as refused:
        range_source(product)
    assert refused.value.refused and "start is not proved never negative" in refused.value.reason
    assert "[-5, " in refused.value.reason


def test_a_range_start_above_zero_sizes_the_table():
    from rope_passes.proofs.positions import range_source

    model, product = _range_with_start("k = Constant <value_int = 300> ()\n start = Add (past, k)")
    found = range_source(product)
    assert found is not None and found.excess == 300 and found.start.lo == 300
    model, product = _range_with_start("start = Identity (past)")
    found = range_source(product)
    assert found is not None and found.excess == 0 and found.start.lo == 0
