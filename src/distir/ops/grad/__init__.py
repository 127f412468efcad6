"""Gradient ops (family ``grad``): the backward counterparts of forward ops that are not
themselves compositions of forward ops (``ReluGrad(dy, x) = dy * (x > 0)``, ...), one module per
forward family they follow: ``nn`` (activations, softmaxes, normalizations), ``loss``, ``conv``
(convolution and pooling), ``index`` (Gather and Slice). Importing this package registers them.

Each takes the incoming gradient first and returns the gradient of the forward op's inputs, in
the forward op's attribute conventions. References compute in float64 and round once.
Sharding rules (``distir.ops.sharding``): every gradient here is linear in the incoming gradient,
so a pending sum on it (the other inputs replicated) passes to every result.
"""

from distir.ops.grad import conv, index, loss, nn  # noqa: F401  (registration)
