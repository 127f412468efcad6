"""The sharding layer: DTensor programs on device meshes.

- ``propagate``: from placements annotated on a few values to a placement for every value
  (``plan``: what a function alone fixes, for any mesh; ``choices``: the strategy each op takes
  and what it costs);
- ``legalize``: every change of placement an explicit ``Redistribute``;
- ``sink_reductions``: an op moved across a pending reduction where its rule allows;
- ``materialize``: explicit per-device programs with local shapes;
- ``shard_function``: one layer function annotated, propagated and legalized (the D and T of
  D/T/P/K).

Nothing is imported here: import the module you need.
"""
