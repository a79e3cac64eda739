"""Builders: one per config group, each a small function from its config node to real TensorFlow objects."""
