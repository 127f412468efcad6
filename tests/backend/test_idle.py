"""``distir.backend.idle.poll_idle``: it writes a 32-bit 0 wake-up latency to the PM QoS device,
holds it open for the block and closes it after; when it cannot, it says why and changes nothing."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from distir.backend.idle import idle_driver, poll_idle


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc (Linux)")
def test_the_request_is_a_32_bit_zero_held_for_the_block_only(tmp_path: Path) -> None:
    dev = tmp_path / "cpu_dma_latency"  # a file stands in for the device: it records the write
    dev.write_bytes(b"\xff" * 4)
    before = _open_fds()
    with poll_idle(dev) as why:
        assert why is None
        assert _open_fds() == before + 1  # held open: the kernel keeps the request while it is
        assert struct.unpack("i", dev.read_bytes()[:4]) == (0,)
    assert _open_fds() == before  # closed: the request ends


def test_a_device_it_cannot_open_is_a_reason_not_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-device"
    with poll_idle(missing) as why:
        assert why is not None and str(missing) in why
    assert not missing.exists()


def test_the_block_runs_and_the_request_ends_when_it_raises(tmp_path: Path) -> None:
    dev = tmp_path / "cpu_dma_latency"
    dev.write_bytes(b"")
    before = _open_fds() if Path("/proc/self/fd").is_dir() else 0
    with pytest.raises(KeyError), poll_idle(dev):
        raise KeyError("inside")
    if Path("/proc/self/fd").is_dir():
        assert _open_fds() == before


def test_the_idle_driver_is_named_or_empty() -> None:
    got = idle_driver()
    assert isinstance(got, str)
    base = Path("/sys/devices/system/cpu/cpuidle/current_driver")
    if base.exists():
        assert got.startswith(base.read_text(encoding="utf-8").strip())
