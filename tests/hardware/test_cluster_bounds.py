"""Cluster files and specs beyond what ``tomllib`` or memory can take end in a ClusterError with
the line (issue 22): deep nesting, thousands of digits, GPU counts beyond ``MAX_DEVICES``; a
UTF-8 byte order mark is accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from distir.hardware.cluster import cluster_from_toml, load_cluster_file
from distir.hardware.specs import ClusterError
from distir.limits import MAX_DEVICES, TOML_MAX_DIGITS, TOML_MAX_NESTING

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "amp_hetero.toml"


@pytest.mark.parametrize("depth", [TOML_MAX_NESTING + 1, 5000])
def test_deeply_nested_arrays_are_a_cluster_error(depth: int) -> None:
    text = 'name = "x"\nv = ' + "[" * depth + "]" * depth + "\n"
    with pytest.raises(ClusterError, match=f"nested deeper than {TOML_MAX_NESTING} levels") as e:
        cluster_from_toml(text, "deep.toml")
    assert e.value.line == 2


def test_nesting_at_the_bound_reaches_the_loader() -> None:
    text = "v = " + "[" * TOML_MAX_NESTING + "]" * TOML_MAX_NESTING + "\n"
    with pytest.raises(ClusterError, match="unknown key"):  # parsed by tomllib, then validated
        cluster_from_toml(text, "ok.toml")


@pytest.mark.parametrize("digits", [TOML_MAX_DIGITS + 1, 5000])
def test_numbers_of_thousands_of_digits_are_a_cluster_error(digits: int) -> None:
    text = '[[nodes]]\ntype = "dgx-a100"\ncount = ' + "9" * digits + "\n"
    with pytest.raises(ClusterError, match=f"more than {TOML_MAX_DIGITS} digits") as e:
        cluster_from_toml(text, "digits.toml")
    assert e.value.line == 3


def test_long_digit_runs_inside_strings_are_text() -> None:
    text = f'[[nodes]]\ntype = "dgx-a100"\n# {"1" * 100}\n'
    assert cluster_from_toml(text).num_devices == 8
    with pytest.raises(ClusterError, match="unknown node type"):
        cluster_from_toml(f'[[nodes]]\ntype = "{"1" * 100}"\n')


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            '[types.a]\npreset = "dgx-a100"\ndevices_per_node = 100000000\n[[nodes]]\ntype = "a"\n',
            "GPUs per node",
        ),
        ('[[nodes]]\ntype = "dgx-a100"\ncount = 1000000000\n', "number of nodes"),
        ('[[nodes]]\ntype = "dgx-a100"\ncount = 8193\n', "GPU count = 65,544"),
        ('[[nodes]]\ntype = "dgx-a100"\ncount = 1e9\n', "expected a positive integer"),
    ],
)
def test_gpu_counts_beyond_the_bound_are_refused_before_the_node_list_grows(text: str, want: str) -> None:
    with pytest.raises(ClusterError, match=want):
        cluster_from_toml(text, "big.toml")


def test_a_cluster_at_the_bound_loads() -> None:
    text = f'[[nodes]]\ntype = "dgx-a100"\ncount = {MAX_DEVICES.max // 8}\n'
    assert cluster_from_toml(text).num_devices == MAX_DEVICES.max


def test_a_byte_order_mark_is_no_content(tmp_path: Path) -> None:
    p = tmp_path / "bom.toml"
    p.write_bytes(b"\xef\xbb\xbf" + EXAMPLE.read_bytes())
    assert load_cluster_file(p).num_devices == load_cluster_file(EXAMPLE).num_devices
