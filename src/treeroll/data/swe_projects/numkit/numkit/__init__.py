"""Pure-Python numerics."""
