"""Simulating DTensor programs directly (SPMD) against simulating their materialized programs.

With even shards every device of a mesh does the same work, so the SPMD simulation (an op holds
its whole mesh for the slowest device) and the materialized program (one op per device) must give
the same step time and the same peak memory on every GPU. With uneven shards the SPMD step time is
at least the materialized one: there an op waits for the device with the largest piece, while a
materialized device with a smaller piece goes on early. Memory stays exact (each device holds its
own piece).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import distir
from distir.hardware.cluster import Cluster, parse_cluster
from distir.interp.loop import InterpretError
from distir.interp.shapes import entry_args
from distir.ir import Device, DTensorType, DType, Module, parse_module
from distir.ir.dtensor import Mesh, Placement
from distir.ir.rewrite import inline_calls
from distir.ops import OpTypeError
from distir.parallel.sharding.legalize import legalize
from distir.parallel.sharding.materialize import local_shape, materialize
from distir.parallel.sharding.propagate import propagate
from distir.sim.cost import RooflineCostModel
from distir.sim.devices import DeviceMap, DeviceMapError, Slot
from distir.sim.plan import PlanDomain
from distir.sim.simulate import SimResult, simulate
from distir.sim.units import step_types, uniform_shape
from parallel.gen import RedistCase, annotations, meshes, mlp_programs, places_text, redist_cases
from parallel.helpers import sharded
from parallel.test_megatron import MLP

DGX = parse_cluster("dgx-a100:2")  # 16 GPUs on two nodes: groups may span the network


def both(m: Module, cluster: Cluster = DGX, **kw: object) -> tuple[SimResult, SimResult]:
    """(SPMD simulation of the DTensor program, simulation of its materialized program)."""
    m = distir.check(m)
    mat = distir.check(materialize(m))
    return simulate(m, cluster, **kw), simulate(mat, cluster, **kw)  # type: ignore[arg-type]


def assert_same(spmd: SimResult, mat: SimResult) -> None:
    assert math.isclose(spmd.step_time_s, mat.step_time_s, rel_tol=1e-9), (spmd.step_time_s, mat.step_time_s)
    assert_same_memory(spmd, mat)
    assert math.isclose(spmd.flops, mat.flops, rel_tol=1e-12)


def assert_same_memory(spmd: SimResult, mat: SimResult) -> None:
    assert spmd.peak_memory.keys() == mat.peak_memory.keys()
    for g, b in mat.peak_memory.items():
        assert math.isclose(spmd.peak_memory[g], b, rel_tol=1e-12), (g, spmd.peak_memory, mat.peak_memory)
    assert spmd.param_memory == mat.param_memory


def all_even(m: Module) -> bool:
    """Every DTensor value (and every intermediate layout of a Redistribute) splits evenly."""
    typed = distir.check(Module((inline_calls(m),)))  # every value typed at its call site
    for fn in typed.functions:
        for v in fn.params:
            if isinstance(v.type, DTensorType) and uniform_shape(v.type) is None:
                return False
        for op in fn.body:
            for v in op.outputs:
                if isinstance(v.type, DTensorType) and uniform_shape(v.type) is None:
                    return False
            if op.name == "Redistribute":
                src, dst = op.inputs[0].type, op.outputs[0].type
                assert isinstance(src, DTensorType) and isinstance(dst, DTensorType)
                if any(uniform_shape(after) is None for *_, after in step_types(src, dst)):
                    return False
    return True


def _tp(n: int) -> Mesh:
    return Mesh((("tp", n),), tuple(Device(i) for i in range(n)))


# -- the acceptance programs ----------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 4, 8])
def test_megatron_mlp_spmd_equals_materialized(n: int) -> None:
    legal, mat = sharded(parse_module(MLP), _tp(n), {"w1": "S(1)", "w2": "S(0)"})
    assert all_even(legal)
    assert [op.name for op in mat.entry.ops()].count("AllReduce") == 1
    spmd, flat = simulate(legal, DGX), simulate(mat, DGX)
    assert_same(spmd, flat)
    assert spmd.comm_s[0] > 0  # the all-reduce is there, on every device of the mesh
    assert spmd.slot_devices == flat.slot_devices


def test_megatron_mlp_uneven_waits_for_the_largest_shard() -> None:
    """64 hidden units over 3 devices are 22, 21, 21: the SPMD op waits for the 22-unit shard
    on every device, so the step is at least the materialized one (and longer here: d1 and d2
    finish their smaller MatMuls early there)."""
    legal, mat = sharded(parse_module(MLP), _tp(3), {"w1": "S(1)", "w2": "S(0)"})
    assert not all_even(legal)
    spmd, flat = simulate(legal, DGX), simulate(mat, DGX)
    assert spmd.step_time_s >= flat.step_time_s
    assert_same_memory(spmd, flat)
    # every device of the mesh is busy as long as the slowest one
    assert spmd.busy_s[0] == spmd.busy_s[1] == spmd.busy_s[2] == max(flat.busy_s[:3])


DP = "mesh(dp=4; d0, d1, d2, d3)"
X, W = f"DTensor[f32, (64, 256), {DP}, [S(0)]]", f"DTensor[f32, (256, 256), {DP}, [R]]"
DATA_PARALLEL = f"""func @step(%x: {X}, %w: {W}) {{
  %h = MatMul(%x, %w)
  %a = Relu(%h)
  %xt = Transpose(%x)
  %g = MatMul(%xt, %a)
  %gr = Redistribute(%g, to="R")
  %w2 = Sub(%w, %gr)
  return %w2, %a
}}
"""


def test_data_parallel_step_with_allreduce() -> None:
    m = parse_module(DATA_PARALLEL)
    mat = distir.check(materialize(distir.check(m)))
    assert [op.name for op in mat.entry.ops()].count("AllReduce") == 1
    spmd, flat = both(m)
    assert_same(spmd, flat)
    assert all(c > 0 for c in spmd.comm_s[:4])


def _two_stages(dp: int, tp: int, micro: int, rows: int = 8, hidden: int = 16) -> str:
    """Two pipeline stages on meshes (dp, tp) of their own; untyped layer functions (forward and
    backward, Megatron-style with a data-parallel gradient all-reduce) called on both meshes;
    activations move between stages with MeshSend; GPipe order."""
    n = dp * tp
    a = f"mesh(dp={dp}, tp={tp}; {', '.join(f'd{i}' for i in range(n))})"
    b = f"mesh(dp={dp}, tp={tp}; {', '.join(f'd{n + i}' for i in range(n))})"
    attr = {a: a[5:-1], b: b[5:-1]}

    def t(shape: str, mesh: str, places: str) -> str:
        return f"DTensor[f32, {shape}, {mesh}, [{places}]]"

    params = [f"%x{k}: {t(f'({rows}, {hidden})', a, 'S(0), R')}" for k in range(micro)]
    for s, mesh in (("a", a), ("b", b)):
        params += [
            f"%w1{s}: {t(f'({hidden}, {4 * hidden})', mesh, 'R, S(1)')}",
            f"%w2{s}: {t(f'({4 * hidden}, {hidden})', mesh, 'R, S(0)')}",
        ]
    body = []
    for k in range(micro):
        body += [
            f"  %h{k}, %u{k} = @fwd(%x{k}, %w1a, %w2a)",
            f'  %hb{k} = MeshSend(%h{k}, mesh="{attr[b]}")',
            f"  %y{k}, %v{k} = @fwd(%hb{k}, %w1b, %w2b)",
        ]
    for k in range(micro):
        body += [
            f"  %dy{k}, %gb{k} = @bwd(%y{k}, %hb{k}, %v{k}, %w1b, %w2b)",
            f'  %da{k} = MeshSend(%dy{k}, mesh="{attr[a]}")',
            f"  %dx{k}, %ga{k} = @bwd(%da{k}, %x{k}, %u{k}, %w1a, %w2a)",
        ]
    outs = ", ".join(f"%ga{k}, %gb{k}" for k in range(micro))
    return (
        """func @fwd(%x, %w1, %w2) {
  %h = MatMul(%x, %w1)
  %a = Gelu(%h)
  %y = MatMul(%a, %w2)
  %r = Redistribute(%y, to="S(0), R")
  %o = Add(%r, %x)
  return %o, %h
}

func @bwd(%dy, %x, %h, %w1, %w2) {
  %w2t = Transpose(%w2)
  %dh = MatMul(%dy, %w2t)
  %dg = GeluGrad(%dh, %h)
  %w1t = Transpose(%w1)
  %dxp = MatMul(%dg, %w1t)
  %dxr = Redistribute(%dxp, to="S(0), R")
  %dx = Add(%dxr, %dy)
  %xt = Transpose(%x)
  %dw = MatMul(%xt, %dg)
  %dwr = Redistribute(%dw, to="R, S(1)")
  return %dx, %dwr
}

"""
        + f"func @train({', '.join(params)}) {{\n"
        + "\n".join(body)
        + f"\n  return {outs}\n}}\n"
    )


@pytest.mark.parametrize(("dp", "tp", "micro"), [(2, 2, 2), (1, 4, 3), (4, 2, 1)])
def test_two_meshes_with_meshsend_and_calls(dp: int, tp: int, micro: int) -> None:
    m = parse_module(_two_stages(dp, tp, micro))
    mat = distir.check(materialize(distir.check(m)))
    names = [op.name for op in mat.entry.ops()]
    assert names.count("Send") == 2 * micro * dp * tp  # one per device, per MeshSend
    spmd, flat = both(m)
    assert_same(spmd, flat)
    # the calls were kept: the layer functions are summarized, once per mesh
    assert spmd.n_ops < flat.n_ops


def test_two_meshes_uneven_rows() -> None:
    """10 rows over dp=4 are 3, 3, 2, 2: the SPMD step is at least the materialized one."""
    m = parse_module(_two_stages(4, 2, 2, rows=10))
    assert not all_even(m)
    spmd, flat = both(m)
    # (equal here up to summation order: 3- and 2-row shards pad to the same GEMM tiles)
    assert spmd.step_time_s >= flat.step_time_s * (1 - 1e-12)
    assert_same_memory(spmd, flat)


# -- properties -----------------------------------------------------------------------------------
PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def sharded_mlps(draw: st.DrawFn) -> Module:
    """A random sharded MLP (tests/parallel/gen.py), legalized; no constants (a constant of the
    logical program sits on its one device here, but on every device once materialized)."""
    text, params = draw(mlp_programs(dtype="f32").filter(lambda tp: "Constant" not in tp[0]))
    mesh = draw(meshes)
    ann = draw(annotations(params, mesh))
    m = distir.check(parse_module(text))
    return distir.check(legalize(propagate(m, mesh, {k: places_text(v) for k, v in ann.items()}).module))


def has_empty_pieces(m: Module) -> bool:
    """Some device holds an empty piece of some value. (The materialized simulation then counts
    an op writing an empty piece, such as a Slice, as a view of its input, which keeps the input
    alive longer; one SPMD op cannot be a view on some devices only, so memory may differ.)"""
    typed = distir.check(Module((inline_calls(m),)))
    for v in (*typed.entry.params, *(o for op in typed.entry.body for o in op.outputs)):
        t = v.type
        if isinstance(t, DTensorType) and any(
            0 in local_shape(t, d) and 0 not in t.shape for d in t.mesh.devices
        ):
            return True
    return False


@PROPS
@given(sharded_mlps())
def test_random_sharded_mlps(m: Module) -> None:
    spmd, flat = both(m)
    if not has_empty_pieces(m):
        assert_same_memory(spmd, flat)
    if all_even(m):
        assert math.isclose(spmd.step_time_s, flat.step_time_s, rel_tol=1e-9)
    else:
        assert spmd.step_time_s >= flat.step_time_s * (1 - 1e-12)


def _moved(case: RedistCase, keep_source: bool) -> Module:
    """``case``'s redistribution of a value that arrives by MeshSend from a second mesh (so the
    source is a fresh buffer that dies at the Redistribute, or lives on when also returned)."""
    mesh, n = case.mesh, len(case.mesh.devices)
    other = Mesh(mesh.axes, tuple(Device(n + i) for i in range(n)))
    src = DTensorType(DType.f32, case.shape, other, case.src)
    dst = DTensorType(DType.f32, case.shape, mesh, case.dst)
    attr = str(mesh)[5:-1]
    ret = "%y, %x" if keep_source else "%y"
    return parse_module(
        f"func @f(%x0: {src}) {{\n"
        f'  %x = MeshSend(%x0, mesh="{attr}")\n'
        f'  %y: {dst} = Redistribute(%x, to="{places_text(case.dst)}")\n'
        f"  return {ret}\n}}\n"
    )


@PROPS
@given(redist_cases(), st.booleans())
def test_every_redistribution(case: RedistCase, keep_source: bool) -> None:
    """Every lowering (and multi-step ones: their intermediate layouts are held as in the
    lowering, the source freed after the first step when nothing else uses it)."""
    m = _moved(case, keep_source)
    spmd, flat = both(m)
    assert_same_memory(spmd, flat)
    if all_even(m):
        assert math.isclose(spmd.step_time_s, flat.step_time_s, rel_tol=1e-9)
    else:
        assert spmd.step_time_s >= flat.step_time_s * (1 - 1e-12)


MULTI_STEP = [
    ((4, 4), (2, 2), "P(sum), P(sum)", "R, R"),
    ((4, 6), (2, 2), "S(0), S(1)", "S(1), S(0)"),
    ((5, 7), (2, 3), "P(sum), S(0)", "S(0), R"),
    ((5, 7), (2, 3), "S(1), P(max)", "R, S(1)"),
    ((3, 5, 2), (2, 2), "S(0), S(2)", "S(2), S(1)"),
]


@pytest.mark.parametrize("keep_source", [False, True])
@pytest.mark.parametrize(("shape", "mesh", "src", "dst"), MULTI_STEP)
def test_multi_step_redistributions(
    shape: tuple[int, ...], mesh: tuple[int, ...], src: str, dst: str, keep_source: bool
) -> None:
    from distir.ir.dtensor import parse_placements
    from parallel.gen import mesh_of

    case = RedistCase(shape, mesh_of(mesh), parse_placements(src), parse_placements(dst))
    m = _moved(case, keep_source)
    a, b = distir.check(m).entry.body[1].inputs[0].type, distir.check(m).entry.outputs[0].type
    assert isinstance(a, DTensorType) and isinstance(b, DTensorType)
    assert len(step_types(a, b)) > 1
    spmd, flat = both(m)
    assert_same_memory(spmd, flat)
    assert spmd.step_time_s >= flat.step_time_s * (1 - 1e-12)


def test_multi_step_peak_by_hand() -> None:
    """[P, P] -> [R, R] of 64 bytes per device: all-reduce along one axis, then the other. While
    the second step runs, a device holds the first step's result and the second's (128 bytes);
    the source is freed after the first step unless it is used later (then 192 bytes)."""
    case = RedistCase((4, 4), mesh_of_2x2(), parse_pl("P(sum), P(sum)"), parse_pl("R, R"))
    for keep, want in ((False, 128.0), (True, 192.0)):
        spmd, flat = both(_moved(case, keep))
        for r in (spmd, flat):  # the tensors' peak: the reported peak less the runtime memory
            runtime = [DGX.device_spec(g).runtime.overhead(want) for g in range(4)]
            assert [r.runtime_memory[g] for g in range(4)] == runtime
            assert [r.peak_memory[g] for g in range(4)] == [want + x for x in runtime]


@pytest.mark.parametrize(
    ("src", "dst", "moves"),
    [
        ("S(0), R", "R, R", False),  # dp of one device: the whole batch is already there
        ("P(sum), S(1)", "R, S(1)", False),  # a sum of one piece
        ("R, S(1)", "S(0), S(1)", False),
        ("S(0), P(sum)", "R, R", True),  # the tp step moves (an all-reduce over 3), the dp one not
    ],
)
def test_steps_along_an_axis_of_one_device_move_nothing(src: str, dst: str, moves: bool) -> None:
    """On a (1, 3) mesh every placement along the first axis is the same piece: a Redistribute
    that changes only that axis is a view (no time, no buffer), in the SPMD simulation and in the
    materialized program alike; one that also changes the second axis costs that step alone."""
    mesh = "mesh(dp=1, tp=3; d0, d1, d2)"

    def prog(at: str, redistribute: bool) -> Module:
        moved = f'  %y = Redistribute(%x, to="{dst}")\n  %z = Exp(%y)\n'
        body = moved if redistribute else "  %z = Exp(%x)\n"
        return distir.check(
            parse_module(f"func @f(%x: DTensor[f32, (6, 9), {mesh}, [{at}]]) {{\n{body}  return %z\n}}\n")
        )

    m = prog(src, True)
    spmd, flat = both(m)
    assert_same(spmd, flat)
    lowered = [o.name for o in materialize(m).entry.body if o.name != "Exp"]
    assert bool(lowered) == moves, lowered
    ref = simulate(prog(dst, False), DGX)
    if moves:
        assert spmd.step_time_s > ref.step_time_s
    else:  # the program that starts in the target layout
        assert spmd.step_time_s == ref.step_time_s
        assert spmd.peak_memory == ref.peak_memory


def mesh_of_2x2() -> Mesh:
    return Mesh((("a", 2), ("b", 2)), tuple(Device(i) for i in range(4)))


def parse_pl(text: str) -> tuple[Placement, ...]:
    from distir.ir.dtensor import parse_placements

    return parse_placements(text)


# -- devices and units ----------------------------------------------------------------------------
def test_devices_not_on_the_cluster() -> None:
    m = distir.check(parse_module(_two_stages(2, 2, 1)))  # 8 devices
    with pytest.raises(DeviceMapError, match=r"uses 8 devices .* has 4 GPUs"):
        simulate(m, _four())
    partial = DeviceMap({Device(i): Slot(i) for i in range(4)})  # stage 1's mesh is not mapped
    with pytest.raises((InterpretError, OpTypeError), match="device d4 is not mapped onto the cluster"):
        simulate(m, DGX, device_map=partial)


def _four() -> Cluster:
    from distir.hardware.specs import DeviceSpec, LinkSpec, NodeSpec

    dev = DeviceSpec("four", 1e12, 1e12, 1e12, 1e12, 1e11, 1 << 30, 0.0)
    return Cluster("four", (NodeSpec("fournode", dev, 4, LinkSpec(1e10, 1e-6), LinkSpec(1e9, 1e-5)),))


def test_a_mesh_of_even_shards_is_one_unit() -> None:
    """The plan of a two-stage program on 2 x 128 devices runs over 2 clocks (one per mesh)."""
    m = distir.check(parse_module(_two_stages(16, 8, 2, rows=32)))
    cl = parse_cluster("dgx-a100:32")
    dmap = DeviceMap.default(range_devices(256), cl.num_devices)
    dom = PlanDomain(m, dmap, RooflineCostModel(cl))
    plan = dom.plan(m.entry, entry_args(m.entry))
    assert dom.units.units is not None
    assert sorted(len(u) for u in dom.units.units) == [128, 128]
    assert plan.slots == (0, 1)


def range_devices(n: int) -> list[Device]:
    return [Device(i) for i in range(n)]


def test_streams_sharing_a_gpu_keep_one_clock_per_device() -> None:
    """A device map with two devices of a mesh on one GPU (two streams) cannot use units (memory
    is per GPU, clocks per stream): the SPMD simulation still equals the materialized one."""
    m = parse_module(DATA_PARALLEL)
    dmap = DeviceMap.parse("d0=0,d1=0:s1,d2=1,d3=1:s1", [Device(i) for i in range(4)], DGX.num_devices)
    spmd, flat = both(m, device_map=dmap)
    assert_same(spmd, flat)
    assert set(spmd.peak_memory) == {0, 1}


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ("S(0), S(0)", "R, R"),
        ("S(0), S(0)", "S(0), R"),
        ("S(0), P(sum)", "S(0), S(0)"),
        ("R, S(0)", "S(0), S(0)"),
    ],
)
def test_redistribute_of_a_nested_dim_simulates_as_its_lowering(src: str, dst: str) -> None:
    """A dim sharded along two mesh axes (nested): the SPMD simulation runs the lowering's steps
    (gathered from the innermost axis out, split from the outermost in) and equals the
    materialized program's simulation."""
    mesh = "mesh(a=2, b=2; d0, d1, d2, d3)"
    m = parse_module(
        f"func @f(%x: DTensor[f32, (64, 8), {mesh}, [{src}]]) {{\n"
        f'  %y = Redistribute(%x, to="{dst}")\n  return %y\n}}\n'
    )
    assert_same(*both(m))


def test_communication_streams_share_gpus_with_compute() -> None:
    """Activations hop through communication-stream meshes (``distribute(comm_streams=True)``'s
    form): stream devices share GPUs with compute devices, memory adds up per GPU, and units still
    apply (a unit holds one stream of several GPUs)."""

    def mesh(first: int) -> str:
        return f"mesh(dp=2, tp=2; {', '.join(f'd{first + i}' for i in range(4))})"

    x, w = f"DTensor[f32, (8, 64), {mesh(0)}, [S(0), R]]", f"DTensor[f32, (64, 64), {mesh(12)}, [R, S(1)]]"
    text = f"""func @f(%x: {x}, %w: {w}) {{
  %a = Relu(%x)
  %s1 = MeshSend(%a, mesh="{mesh(4)[5:-1]}")
  %s2 = MeshSend(%s1, mesh="{mesh(8)[5:-1]}")
  %b = MeshSend(%s2, mesh="{mesh(12)[5:-1]}")
  %y = MatMul(%b, %w)
  return %y, %a
}}
"""
    spec = ",".join(
        [f"d{i}={i}" for i in range(4)]
        + [f"d{4 + i}={i}:fwd" for i in range(4)]
        + [f"d{8 + i}={4 + i}:fwd" for i in range(4)]
        + [f"d{12 + i}={4 + i}" for i in range(4)]
    )
    dmap = DeviceMap.parse(spec, [Device(i) for i in range(16)], DGX.num_devices)
    m = distir.check(parse_module(text))
    spmd, flat = both(m, device_map=dmap)
    assert_same(spmd, flat)
    assert set(spmd.peak_memory) == set(range(8))
    dom = PlanDomain(m, dmap, RooflineCostModel(DGX))
    dom.plan(m.entry, entry_args(m.entry))
    assert dom.units.units is not None and len(dom.units.units) == 4  # one per mesh
