"""isl-backed simplification of te_grad iteration domains."""
