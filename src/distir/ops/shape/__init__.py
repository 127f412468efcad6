"""The shape family (ONNX names): ops that make, rearrange, select and join tensors. Importing
this package registers every op of the family; each op's whole definition (type rule, numpy
reference, costs, sharding rule, gradient rule, torch implementation) is in one module:

- ``creation``: Shape, Constant, Range, ConstantOfShape;
- ``views``: Reshape, Expand, Unsqueeze, Squeeze, Transpose;
- ``select``: Gather, Slice, Trilu;
- ``join``: Concat, Split;
- ``family``: the family's name and cost shared by them.
"""

from distir.ops.shape import creation, join, select, views  # noqa: F401  (registration)
