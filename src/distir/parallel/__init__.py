"""Parallelism as program transforms: sharding on device meshes (propagation, legalization,
materialization into explicit per-device programs)."""
