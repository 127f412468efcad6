"""The cost of a layout: analytic (the quick judge of every state the search meets), then
simulated (``distir.sim.simulate``, for the few best).

``AnalyticJudge`` costs a state from its propagation on the searched axis and, once, the
propagation of each fixed axis: per op its roofline time (``RooflineCostModel`` at global types)
divided by the devices that split its work (an axis splits it unless the op's strategy there is
all-replicated; the launch is never split), plus per redistribution the alpha-beta time of its
collective (``distir.sim.collectives``) over the axis' devices, at the bytes each device holds
(the other axes' shards divide them). Memory is the sum of every value's local bytes — an upper
bound of the peak, as Automap's conservative liveness estimate — and a layout over the device's
capacity pays ``OVER_CAPACITY`` times its overflow ratio. Communicated bytes break ties.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from distir.hardware.cluster import Cluster
from distir.ir.dtensor import Mesh, Partial, Placement, Replicate, Shard
from distir.ir.types import TensorType
from distir.ir.values import Value
from distir.ops.registry import REGISTRY
from distir.ops.sharding import Strategy
from distir.parallel.sharding.propagate import Placed, place, redistribution_bytes
from distir.search.automap.points import Problem
from distir.sim import collectives as coll
from distir.sim.cost import RooflineCostModel

OVER_CAPACITY = 10.0


class Cost(NamedTuple):
    """A layout's cost: seconds (with the memory penalty), then bytes moved per device."""

    seconds: float
    comm_bytes: float
    memory: float

    @property
    def key(self) -> tuple[float, float]:
        return (self.seconds, self.comm_bytes)


def replicated(st: Strategy) -> bool:
    return all(type(p) is Replicate for p in st.ins) and all(type(p) is Replicate for p in st.outs)


def move_seconds(
    cluster: Cluster, group: Sequence[int], nbytes: float, src: Placement, dst: Placement
) -> float:
    """The collective that moves a tensor of ``nbytes`` (this device's share before the move,
    other axes' shards applied) from ``src`` to ``dst`` along ``group``; 0 for a local slice."""
    if src == dst or isinstance(src, Replicate):
        return 0.0
    n = len(group)
    if isinstance(src, Partial):
        if isinstance(dst, Replicate):
            return coll.allreduce_time(cluster, nbytes, group)
        return coll.reducescatter_time(cluster, nbytes, group)
    if isinstance(dst, Replicate):
        return coll.allgather_time(cluster, nbytes * n, group)
    return coll.alltoall_time(cluster, nbytes, group)


def axis_group(mesh: Mesh, ax: int) -> tuple[int, ...]:
    """The GPUs along axis ``ax`` through the mesh's first device (program device i on GPU i)."""
    first = mesh.coords(mesh.devices[0])
    return tuple(
        d.id for d in mesh.devices if all(c == first[b] for b, c in enumerate(mesh.coords(d)) if b != ax)
    )


class AnalyticJudge:
    """The analytic cost of states of ``problem`` on ``cluster`` (module docstring)."""

    def __init__(self, problem: Problem, cluster: Cluster) -> None:
        self.problem = problem
        self.cluster = cluster
        plan = problem.plan
        mesh = problem.mesh
        model = RooflineCostModel(cluster)
        spec = cluster.device_spec(0)
        self.launch = spec.launch_overhead_s
        self.capacity = spec.tensor_capacity
        self.base = [
            model.compute_time(REGISTRY[op.name], plan.ins[k], plan.outs[k], op.attrs, 0)
            for k, op in enumerate(plan.ops)
        ]
        self.groups = [axis_group(mesh, b) for b in range(len(mesh.axes))]
        self.fixed = [self._fixed_axis(b) for b in range(len(mesh.axes)) if b != problem.axis]
        fixed_axes = [b for b in range(len(mesh.axes)) if b != problem.axis]
        # per op: the devices of the fixed axes that split its work; per value: its shards there
        self.split = [1] * len(plan.ops)
        self.shards: dict[Value, int] = {}
        for b, got in zip(fixed_axes, self.fixed, strict=True):
            n = mesh.axes[b][1]
            for k, op in enumerate(plan.ops):
                if not replicated(got.strategies[op][0]):
                    self.split[k] *= n
            for v, ps in got.placed.items():
                if isinstance(ps[0], Shard):
                    self.shards[v] = self.shards.get(v, 1) * n
        self.fixed_moves = [
            m for b, got in zip(fixed_axes, self.fixed, strict=True) for m in self._moves_of(b, got)
        ]

    def _fixed_axis(self, b: int) -> Placed:
        pr = self.problem
        name, n = pr.mesh.axes[b]
        mesh = Mesh(((name, n),), pr.mesh.devices[:n])
        params = {i: (pl[b] or Replicate(),) for i, pl in pr.fixed.items()}
        results = {r: params[i] for r, i in pr.pairs.items() if i in params}
        notes = {name: (pl[b],) for name, pl in pr.pins.items()}
        return place(pr.plan, mesh, notes, params, results, replicate_results=False, pinned=tuple(params))

    def whole_results(self) -> dict[int, tuple[Placement, ...]]:
        """The results that replace no parameter: replicated along the searched axis, on the
        fixed axes as their propagation places them."""
        pr = self.problem
        fixed = iter(self.fixed)
        per_axis = [None if b == pr.axis else next(fixed) for b in range(len(pr.mesh.axes))]
        out = {}
        for r in pr.whole_results:
            v = pr.fn.outputs[r]
            out[r] = tuple(Replicate() if got is None else got.placed[v][0] for got in per_axis)
        return out

    def cost(self, placed: Placed) -> Cost:
        """The cost of a state whose propagation on the searched axis is ``placed``."""
        pr = self.problem
        plan = pr.plan
        n = pr.size
        types = plan.types
        tp_group = self.groups[pr.axis]
        shards = self.shards
        launch = self.launch
        seconds = 0.0
        moved = 0.0
        pl = placed.placed
        memo: dict[tuple[float, Placement, Placement], float] = {}
        for k, op in enumerate(plan.ops):
            st = placed.strategies[op][0]
            div = self.split[k] * (1 if replicated(st) else n)
            base = self.base[k]
            seconds += base if base <= launch else launch + (base - launch) / div
            for i, tv in plan.movable[k]:
                v = op.inputs[i]
                have = pl[v][0]
                want = st.ins[i]
                if have == want:
                    continue
                assert isinstance(tv, TensorType)
                local = tv.nbytes / shards.get(v, 1)
                key = (local, have, want)
                t = memo.get(key)
                if t is None:
                    t = memo[key] = move_seconds(self.cluster, tp_group, local, have, want)
                seconds += t
                moved += redistribution_bytes(tv, have, want, n) / shards.get(v, 1)
        # results: whole, or as the parameter they replace
        fn = pr.fn
        targets: list[tuple[int, Placement]] = [(r, Replicate()) for r in pr.whole_results]
        targets += [(r, pl[fn.params[i]][0]) for r, i in pr.pairs.items()]
        for r, want in targets:
            out = fn.outputs[r]
            got = pl[out][0]
            to = types[out]
            if got != want and isinstance(to, TensorType):
                local = to.nbytes / shards.get(out, 1)
                seconds += move_seconds(self.cluster, tp_group, local, got, want)
                moved += redistribution_bytes(to, got, want, n) / shards.get(out, 1)
        for b, v, tv, have, want in self.fixed_moves:
            split = n if isinstance(pl[v][0], Shard) else 1
            seconds += move_seconds(self.cluster, self.groups[b], tv.nbytes / split, have, want)
            moved += redistribution_bytes(tv, have, want, pr.mesh.axes[b][1]) / split
        memory = 0.0
        for v in plan.tensors:
            vt = types[v]
            if isinstance(vt, TensorType):
                memory += vt.nbytes / shards.get(v, 1) / (n if isinstance(pl[v][0], Shard) else 1)
        if memory > self.capacity:
            seconds *= 1 + OVER_CAPACITY * (memory / self.capacity - 1)
        return Cost(seconds, moved, memory)

    def _moves_of(self, b: int, got: Placed) -> list[tuple[int, Value, TensorType, Placement, Placement]]:
        """The redistributions of fixed axis ``b``: (axis, value, type, from, to)."""
        plan = self.problem.plan
        out = []
        for k, op in enumerate(plan.ops):
            st = got.strategies[op][0]
            for i, tv in plan.movable[k]:
                v = op.inputs[i]
                have, want = got.placed[v][0], st.ins[i]
                if have != want:
                    assert isinstance(tv, TensorType)
                    out.append((b, v, tv, have, want))
        return out
