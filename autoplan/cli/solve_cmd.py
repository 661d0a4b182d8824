"""Commands of this step (being written)."""
