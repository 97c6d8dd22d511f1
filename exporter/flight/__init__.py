"""PyTorch flight-recorder dumps: safe loading, the dump schema, and the cross-rank check."""
