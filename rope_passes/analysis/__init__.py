"""Read-only facts about a graph: RoPE census, graph helpers, placement."""
