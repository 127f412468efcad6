"""Shallow CPU idle states while timing: ``poll_idle()`` holds a CPU wake-up latency of 0.

A rank waiting in a gloo collective sleeps (its threads block on the socket and a condition
variable); its peer's data wakes it. How long that wake-up takes depends on the idle state the
waiting CPU fell into, not on the link: a polling CPU notices the wake-up at once, a halted one
must first be brought back — on a virtual machine whose guest halts at once when idle (Linux's
``cpuidle-haltpoll`` driver with ``haltpoll.guest_halt_poll_ns=0``), that is an exit to the host,
which must schedule the virtual CPU's thread again. On a busy machine the CPUs never go idle
(another process runs while a rank waits) and the wake-up is an interrupt to a running CPU; on a
quiet one every wait halts. So collective and send times measured on the same machine can differ
with how busy it was (on this project's 2-vCPU VM the fitted collectives differed 2–4× between
calibrations, a quiet machine's the slowest), and a calibration made at one load need not hold
at another. NCCL has no such term: its kernels spin on the GPU while they wait.

Linux's PM QoS interface lets a process ask for a maximum wake-up latency for as long as it
holds ``/dev/cpu_dma_latency`` open (``Documentation/power/pm_qos_interface.rst``): writing a
32-bit 0 keeps every CPU in its polling idle state (cpuidle state 0, ``POLL``), as latency
benchmarks do (``cyclictest``; tuned's ``latency-performance`` profile). Held around calibration
and validation, both meet the same, shallow, wake-up cost at any load. It needs root (or write
access to the device); ``poll_idle`` says why when it cannot, and changes nothing then. The
request ends when the file is closed (on exit from the ``with`` block, or when the process dies).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEVICE = Path("/dev/cpu_dma_latency")


def idle_driver() -> str:
    """The kernel's cpuidle driver and its states (``haltpoll: POLL, haltpoll idle``), or ''."""
    base = Path("/sys/devices/system/cpu/cpuidle")
    try:
        driver = (base / "current_driver").read_text(encoding="utf-8").strip()
        states = sorted(Path("/sys/devices/system/cpu/cpu0/cpuidle").glob("state*"))
        names = [(s / "name").read_text(encoding="utf-8").strip() for s in states]
    except OSError:
        return ""
    return f"{driver}: {', '.join(names)}" if names else driver


@contextmanager
def poll_idle(device: Path = DEVICE) -> Iterator[str | None]:
    """Hold a CPU wake-up latency of 0 µs (see the module docstring) inside the block. Yields
    None when held, else the reason it could not be (no such device, no permission)."""
    try:
        fd = os.open(device, os.O_WRONLY)
    except OSError as e:
        yield f"cannot open {device}: {e.strerror or e}"
        return
    try:
        os.write(fd, struct.pack("i", 0))
    except OSError as e:
        os.close(fd)
        yield f"cannot write {device}: {e.strerror or e}"
        return
    try:
        yield None
    finally:
        os.close(fd)
