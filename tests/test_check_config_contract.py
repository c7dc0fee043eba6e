"""The client's reading of genai_config.json is part of what ``check`` compares (red team 26 round 2: a folder whose
config swaps past_key_names and past_value_names, or states 4 KV heads for a graph of 2, passed every run, since the
checker feeds the graph by its own names; onnxruntime-genai binds the cache and sizes its buffers from the config).
"""

from __future__ import annotations

import copy

import pytest
from conftest import GENAI, genai_models

from rope_passes.analysis.genai_contract import config_mismatches
from rope_passes.config import GenaiConfig
from rope_passes.demo import build_tiny_decoder
from rope_passes.io import load_bundle


def _info(bundle, config=None):
    return bundle.model, GenaiConfig(config) if config is not None else bundle.genai_config


def test_a_config_that_binds_the_cache_wrong_is_named(tmp_path):
    bundle = load_bundle(build_tiny_decoder(tmp_path / "demo"))
    assert config_mismatches(*_info(bundle)) == []
    swapped = copy.deepcopy(bundle.genai_config.data)
    inputs = swapped["model"]["decoder"]["inputs"]
    inputs["past_key_names"], inputs["past_value_names"] = inputs["past_value_names"], inputs["past_key_names"]
    found = config_mismatches(*_info(bundle, swapped))
    assert found and found[0].startswith("past_key_names") and "past_value" in found[0], found
    heads = copy.deepcopy(bundle.genai_config.data)
    heads["model"]["decoder"]["num_key_value_heads"] += 2
    assert any(m.startswith("num_key_value_heads") for m in config_mismatches(*_info(bundle, heads)))
    renamed = copy.deepcopy(bundle.genai_config.data)
    renamed["model"]["decoder"]["outputs"]["present_key_names"] = "present.%d.k"
    assert any("no present output" in m for m in config_mismatches(*_info(bundle, renamed)))


@pytest.mark.corpus
@pytest.mark.parametrize("name", genai_models())
def test_every_builder_config_describes_its_graph(name):
    """No false alarm: the builder's own configs bind every layer's cache as their graphs take it."""
    bundle = load_bundle(GENAI / name)
    assert config_mismatches(*_info(bundle)) == []
