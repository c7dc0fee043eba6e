"""Graph lint rules (rule code, message, explanation, fix)."""
