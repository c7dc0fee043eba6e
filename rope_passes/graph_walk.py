"""Walks over an onnx_ir graph and its subgraphs, in ``onnx_ir.traversal.RecursiveGraphIterator``'s order (a node, then
the nodes of its subgraph attributes in attribute order) at a third of its cost: a whole-graph walk is what most of
rope-passes' graph work is made of (issue 17; tests/test_pipeline_work.py checks the order against onnx_ir's).

A leaf module: it imports nothing of rope_passes, so every layer (io, analysis, passes) may use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any

import onnx_ir as ir

_GRAPH = ir.AttributeType.GRAPH
_GRAPHS = ir.AttributeType.GRAPHS


def _subgraphs_of(node: ir.Node) -> Iterator[ir.Graph]:
    for attr in node.attributes.data.values():  # UserDict's dict: its values() view skips the Mapping layer
        if isinstance(attr, ir.Attr):  # a reference attribute (in a function) holds no graph
            if attr.type == _GRAPH:
                yield attr.value
            elif attr.type == _GRAPHS:
                yield from attr.value


def nodes(graph: ir.Graph) -> Iterator[ir.Node]:
    """Every node of ``graph`` and of its subgraphs, each node before the nodes of its own subgraphs."""
    for node in graph:
        yield node
        if node.attributes.data:
            for sub in _subgraphs_of(node):
                yield from nodes(sub)


def subgraphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """Every subgraph of ``graph`` (not ``graph`` itself), once each, in the order :func:`nodes` enters them
    (``ir.Graph.subgraphs()``'s)."""
    seen: set[int] = {id(graph)}

    def walk(g: ir.Graph) -> Iterator[ir.Graph]:
        for node in g:
            if node.attributes.data:
                for sub in _subgraphs_of(node):
                    if id(sub) not in seen:
                        seen.add(id(sub))
                        yield sub
                    yield from walk(sub)

    return walk(graph)


def graphs(model: ir.Model) -> Iterator[ir.Graph]:
    """The main graph, then every subgraph (``ir.Model.graphs()``'s order)."""
    yield model.graph
    yield from subgraphs(model.graph)


def post_order(root: ir.Value, memo: MutableMapping[int, Any], leaf: Callable[[ir.Value], Any],
               node: Callable[[ir.Node], Sequence[Any]], early: Callable[[ir.Value], Any] | None = None) -> Any:
    """The abstract value of ``root``: its cone evaluated inputs first, without recursion (cones are thousands of
    nodes deep). ``memo`` maps ``id(value)`` to what is known (seeds included); ``leaf(v)`` answers a value without a
    producer, ``node(n)`` a node's outputs once its inputs are in ``memo``; ``early(v)``, when given, may answer a
    produced value before its inputs are walked (None: walk on). A cycle raises ValueError (no valid graph has one)."""
    stack: list[tuple[ir.Value, bool]] = [(root, False)]
    expanding: set[int] = set()
    while stack:
        v, ready = stack.pop()
        if id(v) in memo:
            continue
        producer = v.producer()
        if producer is None:
            memo[id(v)] = leaf(v)
            continue
        if not ready:
            if id(v) in expanding:
                raise ValueError(f"the graph has a cycle through {v.name!r}")
            answer = early(v) if early is not None else None
            if answer is not None:
                memo[id(v)] = answer
                continue
            expanding.add(id(v))
            stack.append((v, True))
            stack.extend((i, False) for i in producer.inputs if i is not None and id(i) not in memo)
            continue
        for out, value in zip(producer.outputs, node(producer), strict=True):
            memo[id(out)] = value
    return memo[id(root)]
