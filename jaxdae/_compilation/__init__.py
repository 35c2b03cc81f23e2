"""Compilation helpers: scalar graphs, small dense linear algebra, XLA options, device meshes."""
