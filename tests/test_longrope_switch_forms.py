"""LongRoPE's switch written other ways, as the detector and the checker read it (red team 35 of issue 32): an ``If``
on ``Not(total > 32)`` with the short table in the then-branch is the builder's switch at 32 (the long side read past
it), a ``Where`` of two whole tables GroupQueryAttention reads is one too, and an ``If(total > 32)`` with the short
table first is no switch point (it reads the short table past 32). ``longrope-concat`` on the same graphs:
tests/test_form_fuzzer.py's ``switch-*`` cases."""

from __future__ import annotations

import numpy as np
import pytest
from mutants import CORPUS, Work
from mutants.table_forms import BASE, switch_as

import rope_passes
from rope_passes.analysis.graph import MS_DOMAIN, nodes_of
from rope_passes.analysis.longrope import find_longrope
from rope_passes.analysis.rotation_tables import Evaluators, _gqa_regimes
from rope_passes.check.models import _longrope
from rope_passes.proofs.constants import table

pytestmark = pytest.mark.corpus


def _variant(kind: str):
    bundle = rope_passes.load_bundle(CORPUS / BASE)
    switch_as(kind)(Work(bundle.model, bundle.genai_config.data))
    return bundle.model


@pytest.mark.parametrize("kind,expected,switch", [
    ("not-swapped", ("if", 32), "If(Not(Greater(total_sequence_length, 32)))"),
    ("where", ("where", 32), "Where(Greater(total_sequence_length, 32))"),
    ("swapped", ("if", None), "If(Greater(total_sequence_length, 32))"),
    ("not", ("if", None), "If(Not(Greater(total_sequence_length, 32)))"),
])
def test_the_switch_point_is_where_the_long_table_starts(kind, expected, switch):
    model = _variant(kind)
    found = find_longrope(model)
    assert found is not None and (found.kind, found.threshold) == expected and found.switch == switch
    checked = _longrope(model, {})
    assert (checked.switch if checked is not None else None) == expected[1]
    if kind == "not-swapped":
        long_rows = {t.shape[0] for t in (table(v) for v in found.long)}
        assert found.negated and long_rows == {found.long_rows} and found.long_rows > found.short_rows


def test_the_negated_switch_reads_the_short_table_up_to_32():
    model = _variant("not-swapped")
    gqa = nodes_of(model, "GroupQueryAttention", MS_DOMAIN)[0]
    notes: list[str] = []
    below, above = _gqa_regimes(model, gqa, None, "cpu", notes, Evaluators(table, None))  # type: ignore[arg-type]
    assert (below.first, below.last, above.first, above.last) == (1, 32, 33, None)
    assert below.cos.shape[0] < above.cos.shape[0] and "then branch" in below.cos_at and "else branch" in above.cos_at
    assert np.array_equal(below.cos, table(find_longrope(model).short[0]))
    assert notes == ["If(Not(Greater(total_sequence_length, 32))): totals <= 32 read the then branch, longer ones the "
                     "else branch"]
