"""``distir.limits``: one grammar for integers (ASCII digits) shared by every parser of user text,
and the documented bounds each parser applies before anything is built (issue 22)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from distir.frontends.zoo.model import ModelError
from distir.frontends.zoo.registry import parse_model_string
from distir.hardware.cluster import parse_cluster
from distir.hardware.specs import ClusterError
from distir.ir.dtensor import Mesh, parse_placements
from distir.ir.parser import ParseError, parse_module
from distir.ir.types import Device, IRTypeError
from distir.limits import MAX_DEGREE, MAX_DEVICES, MAX_LAYERS, is_digits, over, read_int
from distir.parallel.context import RING_STREAMS
from distir.parallel.distribute import STREAMS as DISTRIBUTE_STREAMS
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.sim.devices import STREAMS, DeviceMap, DeviceMapError

# digits Python's str.isdigit() or int() take that are not ASCII: superscript two, Arabic-Indic
# two, fullwidth one, Devanagari three
UNICODE_DIGITS = ("²", "٢", "１", "३")


@pytest.mark.parametrize("text", ["0", "7", "0042", "1234567890"])
def test_ascii_digits_read_as_int(text: str) -> None:
    assert is_digits(text) and read_int(text) == int(text)


@pytest.mark.parametrize("text", ["", " 1", "1 ", "-1", "+1", "1.0", "1e3", "1_000", *UNICODE_DIGITS, "1٢"])
def test_anything_else_is_not_a_number(text: str) -> None:
    assert not is_digits(text) and read_int(text) is None


def test_a_huge_digit_string_reads_above_every_bound_without_int_limits() -> None:
    n = read_int("9" * 5000)  # int() raises ValueError beyond 4,300 digits
    assert n is not None and n > MAX_DEVICES.max and "more than 40 digits" in over("d", n, MAX_DEGREE)


# every parser of user text refuses every Unicode digit where it takes an integer
PARSERS: dict[str, tuple[Callable[[str], object], str, type[Exception]]] = {
    "strategy degree": (parse_strategy, "d{}", StrategyError),
    "strategy HSDP group": (parse_strategy, "d4.z3h{}", StrategyError),
    "strategy partition": (parse_strategy, "p2.L1-{}", StrategyError),
    "strategy placement": (parse_strategy, "d3.@0-1-{}", StrategyError),
    "mesh axis": (Mesh.parse, "tp={}", IRTypeError),
    "mesh shares": (Mesh.parse, "dp=2[1:{}]", IRTypeError),
    "mesh devices": (lambda t: Mesh.parse("tp=2", t), "d0,d{}", IRTypeError),
    "placement S(dim)": (parse_placements, "S({})", IRTypeError),
    "model string": (parse_model_string, "gpt:layers={}", ModelError),
    "cluster spec": (parse_cluster, "dgx-a100:{}", ClusterError),
    "device map": (lambda t: DeviceMap.parse(t, [Device(0)], 8), "d0={}", DeviceMapError),
    "device map device": (lambda t: DeviceMap.parse(t, [Device(2)], 8), "d{}=0", DeviceMapError),
    "IR device": (parse_module, "func @f(%x: Tensor[f32, (2,), d{}]) {{\n  return %x\n}}\n", ParseError),
    "IR shape": (parse_module, "func @f(%x: Tensor[f32, ({},), d0]) {{\n  return %x\n}}\n", ParseError),
    "IR S(dim)": (
        parse_module,
        "func @f(%x: DTensor[f32, (4, 4, 4), mesh(x=2; d0, d1), [S({})]]) {{\n  return %x\n}}\n",
        ParseError,
    ),
}


@pytest.mark.parametrize("digit", UNICODE_DIGITS)
@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_parser_reads_ascii_digits_only(name: str, digit: str) -> None:
    parse, template, error = PARSERS[name]
    parse(template.format("2"))  # the ASCII spelling is accepted
    with pytest.raises(error):
        parse(template.format(digit))


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("d999999999", "d = 999,999,999"),
        ("k100000", "k = 100,000"),
        ("t65537", "t = 65,537"),
        ("d300.t300", "d·c·t·p = 90,000"),
        ("p2.L1-100000", "100,000"),
        ("d" + "9" * 5000, "more than 40 digits"),
    ],
)
def test_strategies_beyond_the_bounds_are_refused_by_the_parser(text: str, want: str) -> None:
    with pytest.raises(StrategyError, match=want):
        parse_strategy(text)


def test_strategies_at_the_bounds_parse() -> None:
    assert parse_strategy(f"d{MAX_DEVICES.max}").devices == MAX_DEVICES.max
    assert parse_strategy(f"k{MAX_DEGREE.max}").k == MAX_DEGREE.max


def test_meshes_beyond_the_bounds_are_refused_before_their_devices_exist() -> None:
    with pytest.raises(IRTypeError, match="1,000,000,000"):
        Mesh.parse("tp=1000000000")
    with pytest.raises(IRTypeError, match="device count = 65,792"):
        Mesh.parse("dp=257,tp=256")
    assert len(Mesh.parse("dp=256,tp=256").devices) == MAX_DEVICES.max


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("gpt:layers=1000000000000", "layers = 1,000,000,000,000"),
        (f"gpt:layers={MAX_LAYERS.max + 1}", "layers = 1,025"),
        ("gpt:hidden=16777217", "hidden = 16,777,217"),
        ("llama:vocab=" + "9" * 5000, "more than 40 digits"),
    ],
)
def test_model_strings_beyond_the_bounds_are_refused(text: str, want: str) -> None:
    with pytest.raises(ModelError, match=want):
        parse_model_string(text)


def test_model_batch_beyond_the_bound_is_refused() -> None:
    with pytest.raises(ModelError, match="the batch = 99,999,999,999,999,999,999"):
        parse_model_string("gpt2-117m").build(99999999999999999999)


def test_cluster_specs_beyond_the_bound_are_refused_before_the_node_list_grows() -> None:
    with pytest.raises(ClusterError, match="800,000,000"):
        parse_cluster("dgx-a100:100000000")
    with pytest.raises(ClusterError, match="more than 40 digits"):
        parse_cluster("dgx-a100:" + "9" * 5000)
    assert parse_cluster(f"dgx-a100:{MAX_DEVICES.max // 8}").num_devices == MAX_DEVICES.max


def test_device_map_streams_are_named_on_the_command_line() -> None:
    DeviceMap.parse("d0=0,d1=0:comm,d2=0:comm2,d3=0:fwd_send", [Device(i) for i in range(4)], 1, STREAMS)
    with pytest.raises(DeviceMapError, match="unknown stream 'bogus'"):
        DeviceMap.parse("d0=0:bogus", [Device(0)], 1, STREAMS)
    assert (
        DeviceMap.parse("d0=0:s1", [Device(0)], 1).mapping[Device(0)].stream == "s1"
    )  # the API names freely


def test_the_stream_list_holds_every_stream_distir_builds() -> None:
    assert set(DISTRIBUTE_STREAMS) | set(RING_STREAMS) <= set(STREAMS)
