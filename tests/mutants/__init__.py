"""Adversarial mutants of the shared corpus graphs: graphs that *look* like a form a pass rewrites and compute
something else (issue 11, "Proofs, not patterns").

A :class:`Mutant` names the corpus graph it starts from (read-only), an in-memory edit, the pass under attack and
what must happen:

* ``expect="refuse"``: no exact rewrite of the pass's form exists for this graph (a naive rewrite is wrong): the
  pass must refuse (or not match) with a reason naming a node, and leave that place as it was;
* ``expect="equivalent"``: a rewrite is allowed (the change is harmless, or the pass's form can express it exactly
  even though a naive reading of the pattern is wrong): if the pass rewrites, the output must compute what the mutant
  computes on an independent reference (``reference``), over calls that vary past length, call length and batch;
  a refusal with a reason naming a node is fine too.

``Mutant.build(dest)`` writes the mutant with ``rope_passes.save_bundle`` and returns the model path and the places
(node names) under attack. Generators live in the sibling modules; :func:`all_mutants` collects them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx_ir as ir

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("ROPE_PASSES_SHARED", REPO.parent / "shared"))
CORPUS = SHARED / "corpus"

REFUSE, EQUIVALENT = "refuse", "equivalent"

#: (past length, call length, batch): what callers vary. Past 37 crosses LongRoPE's original 32; the largest position
#: of a call goes from 2 (a prefill of 3) to 44 (past 37 + 8), across the mutants' switch at 20. Batch 2 only where
#: GroupQueryAttention allows it (a call with past context and more than one token must have batch 1).
Call = tuple[int, int, int]
CALLS: tuple[Call, ...] = ((0, 8, 1), (0, 3, 2), (5, 1, 2), (5, 3, 1), (37, 1, 2), (37, 8, 1))
#: plus totals 24, 25, 31, 32, 33: both sides of LongRoPE's switch at original = 32 and of a switch moved to 24
LONGROPE_CALLS: tuple[Call, ...] = CALLS + ((20, 4, 1), (24, 1, 2), (30, 1, 1), (31, 1, 1), (29, 3, 1), (32, 1, 2))


@dataclasses.dataclass
class Work:
    """What an edit gets: the loaded mutant-to-be (model and genai_config data, both edited in place)."""

    model: ir.Model
    config: dict[str, Any] | None

    @property
    def graph(self) -> ir.Graph:
        return self.model.graph


@dataclasses.dataclass(frozen=True)
class Built:
    path: Path  # what rope_passes.optimize reads: the model folder, or the .onnx file for torch graphs
    model_file: Path
    places: tuple[str, ...]  # node names under attack (the pass's match sites)


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    cls: str  # attack class (see CLASSES)
    pass_name: str
    base: str  # corpus-relative: "genai/current/qwen25_vl/cpu_fp32" or "torch/tf5/dynamo/llama/decode.onnx"
    expect: str  # REFUSE | EQUIVALENT
    edit: Callable[[Work], Sequence[str]] = dataclasses.field(repr=False)  # returns the places under attack
    why: str  # what the mutant computes, and why a naive rewrite is wrong (or harmless)
    target: str | None = "webgpu"  # the preset the mutant runs; None: the pass alone (a pass in no preset)
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: "ort": the mutant itself on onnxruntime CPU; "plugin": the mutant itself on onnxruntime >= 1.31's CPU EP
    #: (``.venv-plugin``: fused q/k-norm GQA and MRotaryEmbedding as that runtime computes them, :mod:`.plugin`);
    #: "qknorm-oracle": the fused q/k-norm of GroupQueryAttention written out by the test (:mod:`.qknorm`);
    #: "mrotary-oracle": the mutant with every MRotaryEmbedding replaced
    #: by the test's own ONNX lowering (checked against the NumPy oracle), on CPU; "offset": the mutant on CPU vs the
    #: output run with multiRotaryCacheConcatOffset emulated; "offset-truth": the mutant graph with the offset its
    #: table really needs (``truth_offset``, known by construction) vs the output with the offset it was given
    reference: str = "ort"
    calls: tuple[Call, ...] = CALLS
    truth_offset: int | None = None
    fp16: bool = False
    #: feed ``[3, B, S]`` positions with three different axes (image/video positions, :class:`.plugin.VisionPositions`)
    vision: bool = False
    #: feed a left-padded ``attention_mask`` (every row starts with a zero) in calls after a past
    #: (:class:`.plugin.LeftPaddedMask`)
    padded: bool = False

    @property
    def id(self) -> str:
        return self.name

    @property
    def source(self) -> Path:
        return CORPUS / self.base

    def build(self, dest: Path) -> Built:
        from rope_passes import load_bundle, save_bundle

        bundle = load_bundle(self.source)
        work = Work(bundle.model, bundle.genai_config.data)
        places = tuple(self.edit(work))
        dest.mkdir(parents=True, exist_ok=True)
        written = Path(save_bundle(bundle, dest))
        if bundle.folder is not None and work.config is not None:
            (dest / "genai_config.json").write_text(json.dumps(work.config, indent=4) + "\n")
        path = dest if bundle.folder is not None else written
        return Built(path, written, places)


#: attack classes, for the per-class count
CLASSES = {
    "position-arithmetic": "pointwise arithmetic between the position input and the rotation (all, q/k only, one axis)",
    "per-call": "math that depends on the call rather than the token: its minimum, maximum, length, batch",
    "tile-edit": "a 2D position input tiled to 3 axes and then edited, so the rotation does not read the tile",
    "switch": "LongRoPE's If condition: what Greater compares, the comparison, the branches",
    "blend": "a per-call short/long frequency choice written as arithmetic (no Where)",
    "mask": "total_sequence_length / seqlens_k computed from something other than the attention mask",
    "cache-offset": "a concatenated LongRoPE cache and the offset genai_config gives it",
    "session": "a session-wide fact (multiRotaryCacheConcatOffset) and every GroupQueryAttention that reads it",
    "harmless": "a change that computes the same (Identity, Cast to the same type, ...)",
    "attribute": "an attribute spelled so that a reader other than onnxruntime's gets another value (absent, 2, 0)",
    "constant-form": "a constant in a form a proof may not read (Constant value_int(s), Cast, Gather(Concat), Identity, "
                     "an initializer that is also a graph input)",
    "graph-output": "a value a pass removes or rewires is also a graph output or has another consumer",
    "subgraph": "an If/Loop body reading a value of the outer graph that a pass removes or rewires",
    "naming": "duplicated node names, names a pass derives its new names from",
    "dtype-shape": "fp16 / bf16, rank-4 inputs, static dims, partial rotary: shapes and dtypes a pass may assume",
    "node-form": "a value a pass reads written in another opset's node forms or a model-local function, or a "
                 "lookalike of it whose values differ (a Pad of ones, a sum over both axes, an int8 Cast)",
}


def all_mutants() -> list[Mutant]:
    from . import (
        adversarial,
        annotate,
        batch_dim,
        cleanup,
        fold_mrope,
        forms,
        longrope,
        lower_mrope,
        precompute,
        table_forms,
        total_seq,
        unfuse,
    )

    out: list[Mutant] = []
    for module in (fold_mrope, longrope, precompute, total_seq, annotate, lower_mrope, unfuse, cleanup, adversarial,
                   batch_dim, forms, table_forms):
        out.extend(module.mutants())
    names = [m.name for m in out]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise AssertionError(f"duplicate mutant names: {sorted(dupes)}")
    return out
