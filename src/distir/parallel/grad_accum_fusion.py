"""Gradient-accumulation fusion: a layer's weight-gradient GEMM accumulates into the fp32 sum.

Megatron-LM's ``--gradient-accumulation-fusion`` (on unless ``--no-gradient-accumulation-fusion``,
megatron/training/arguments.py at f2e5db4) runs the weight-gradient product of each linear
layer as ``fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32(total_input, grad_output,
weight.main_grad)`` (APEX): one GEMM whose C and D are the weight's fp32 ``main_grad``, with
beta = 1, so the product is added into the fp32 gradient buffer inside the GEMM
(``LinearWithGradAccumulationAndAsyncCommunication.backward``,
megatron/core/tensor_parallel/layers.py at f2e5db4); the layer hands autograd a dummy gradient
and sets ``grad_added_to_main_grad``, so the DDP's backward hook adds nothing for it
(``param.main_grad.add_(param.grad.data)`` runs only when ``grad_added_to_main_grad`` is False,
megatron/core/distributed/distributed_data_parallel.py). Transformer Engine's layers do the same
with ``fuse_wgrad_accumulation=config.gradient_accumulation_fusion``
(megatron/core/transformer/custom_layers/transformer_engine.py). Every other parameter (norm
scales and biases, linear biases, the embedding) is added into its fp32 ``main_grad`` by that
hook: one ``add_`` reading the low-precision gradient. The buffer is fp32 for bf16 training
(``accumulate_allreduce_grads_in_fp32``) and is what the buckets reduce: no cast before the
reduction, none after.

distir writes the fused product as the layer's ``MatMul`` followed, in the layer's backward
function, by a ``Cast`` to fp32 and (from the second microbatch on) an ``Add`` into the
accumulated gradient, a parameter of the function: the cost model's fusion rule
(``distir.sim.fusion``) runs the cast and the add as the GEMM's epilogue — one kernel that reads
and writes the fp32 sum and never writes the low-precision product — and no Add kernel runs.
The reference executor rounds the product to the compute dtype before adding it (the kernel
adds it in fp32): a difference within the compute dtype's roundoff. Not modelled: Megatron zeroes
the buffer once per step (``zero_grad_buffer``, a memset) and its first microbatch's GEMM reads
those zeros; here the first microbatch's GEMM writes the fp32 gradient without reading a C.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from distir.ir.function import Function
from distir.ir.ops import Instr, Op
from distir.ir.types import DType
from distir.ir.values import Attrs, Value
from distir.ops.elementwise import ADD, CAST
from distir.ops.linalg import MATMUL


def wgrad_products(fn: Function, first: int) -> tuple[int, ...]:
    """The positions ``j`` (counted from ``fn.outputs[first]``, the first weight gradient) of the
    weight gradients that a ``MatMul`` of ``fn``'s body produces and nothing else reads: the
    products the fusion accumulates in the GEMM."""
    uses = Counter(v for x in fn.body for v in x.inputs)
    uses.update(fn.outputs)
    made = {o: x for x in fn.body if type(x) is Op and x.name == MATMUL.name for o in x.outputs}
    return tuple(j for j, v in enumerate(fn.outputs[first:]) if v in made and uses[v] == 1)


def fused_backward(fn: Function, first: int, which: Sequence[int], master: DType, acc: bool) -> Function:
    """``fn`` with the weight gradients at ``which`` (``wgrad_products``) cast to ``master``
    right after their MatMul and, with ``acc``, added into accumulators: parameters appended
    after ``fn``'s own, one per position of ``which`` in its order. Named ``<fn>_gaf`` (the
    first microbatch) or ``<fn>_gaf_acc``."""
    outs = list(fn.outputs)
    target = {outs[first + j]: k for k, j in enumerate(which)}
    accs = tuple(Value(f"acc_{outs[first + j].name}", None) for j in which) if acc else ()
    to = Attrs({"to": master})
    body: list[Instr] = []
    done: dict[Value, Value] = {}
    for x in fn.body:
        body.append(x)
        for o in x.outputs:
            k = target.get(o)
            if k is None:
                continue
            wide = Value(f"{o.name}_{master}", None)
            body.append(Op(CAST.name, (o,), (wide,), to))
            if acc:
                summed = Value(f"{o.name}_sum", None)
                body.append(Op(ADD.name, (accs[k], wide), (summed,)))
                wide = summed
            done[o] = wide
    name = f"{fn.name}_gaf" + ("_acc" if acc else "")
    return Function(name, (*fn.params, *accs), tuple(body), tuple(done.get(v, v) for v in outs))
