"""Whether this CPU computes a scan's low precision (ablation.dtype) at a usable speed, said before the first pass.

A CPU without native half-precision arithmetic runs float16 (or bfloat16) matrix products in emulation, many times
slower than float32: on this project's 2-core AMD EPYC (torch 2.13.0 CPU), a 256x256 float16 product took about 200
times as long as float32's in one thread (bfloat16: half as long), and a float16 scan of Gemma-3-270M printed nothing
for 400 s. Whether a CPU has it is measured, not
guessed from its name: one small product in each precision (tens of milliseconds), and a scan the precision slows down
`SLOWDOWN_NOTED` times or more is said in one line at once, with the measured factor. The scan then runs as asked
(its numbers are right, only late); float32 (or a precision the CPU has) is the remedy the line names. GPUs are not
measured: their half-precision matrix units are the reason to ask for it.
"""

import time

import torch

from headcount.config.ablation import AblationConfig, ScanDtype
from headcount.processes import console

SLOWDOWN_NOTED = 3.0  # below this a low precision's halved memory traffic can still pay
SIZE = 256  # large enough to reach the matrix kernels, small enough to time in milliseconds
REPEATS = 5  # the fastest of these counts: a loaded machine only slows a product down


def product_seconds(dtype: torch.dtype, device: torch.device) -> float:
    """The fastest of REPEATS SIZE x SIZE matrix products in dtype on device, after one that warms it up."""
    a = torch.randn(SIZE, SIZE, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    a @ a
    fastest = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        a @ a
        fastest = min(fastest, time.perf_counter() - start)
    return fastest


def cpu_slowdown(dtype: torch.dtype) -> float:
    """How many times as long a matrix product takes in dtype as in float32 on this CPU (measured now), in one
    thread: threads waiting for each other on a busy machine would time the machine's load, not the arithmetic."""
    cpu, threads = torch.device("cpu"), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return product_seconds(dtype, cpu) / max(product_seconds(torch.float32, cpu), 1e-9)
    finally:
        torch.set_num_threads(threads)


def note_slow_precision(s: AblationConfig, device: torch.device) -> float | None:
    """One line, before any pass, when the scan's precision is at least SLOWDOWN_NOTED times slower than float32 on
    this CPU; returns the measured factor (None: float32, or not a CPU)."""
    dtype = ScanDtype(s.dtype)
    if dtype == ScanDtype.float32 or device.type != "cpu":
        return None
    slowdown = cpu_slowdown(dtype.torch)
    if slowdown >= SLOWDOWN_NOTED:
        console().print(
            f"[yellow]note:[/yellow] ablation.dtype={dtype.value}: this CPU has no fast {dtype.value} arithmetic (a "
            f"{SIZE}x{SIZE} matrix product took {slowdown:.0f} times as long as in float32, measured now), so this "
            f"scan takes about that much longer than in float32; ablation.dtype=float32 runs at full speed here",
            highlight=False,
            soft_wrap=True,
        )
    return slowdown
