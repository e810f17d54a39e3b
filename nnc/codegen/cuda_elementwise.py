"""CUDA elementwise skeleton, and what every CUDA skeleton shares: the per-kernel generation state
(CudaKernelBuilder: the CPU KernelBuilder's arguments, value names and scalar pass, spelled by the CUDA dialect),
`cuda.jit` function records and their launch configurations.

Elementwise: one grid-stride loop over the flat output index; a broadcast input is read at its offset from the
index's digits (nnc.codegen.indexing, constant divisors). The launch configuration is a pure value of the size
(`elementwise_launch`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


from ..symbolic import has_symbols
from .cpu_elementwise import Array, KernelBuilder, check_elementwise_nodes, indent
from .cuda_dialect import CudaDialect
from .indexing import emit_offsets, shifted
from .scalar import ScalarBody, Unsupported

# Threads per block of a 1-D launch, and the most blocks a grid-stride loop is launched with (each thread then
# takes several elements: fewer, longer-lived threads amortise the index arithmetic).
THREADS = 256
MAX_BLOCKS = 8192
WARP = 32


@dataclass(frozen=True)
class Launch:
    """A kernel launch configuration: blocks per grid and threads per block (1 to 3 dims each)."""

    grid: tuple
    block: tuple

    @property
    def text(self) -> str:
        """The launch's subscript in generated code: `[grid, block]`."""
        one = lambda t: str(t[0]) if len(t) == 1 else repr(tuple(t))  # noqa: E731
        return f"[{one(self.grid)}, {one(self.block)}]"

    @property
    def threads(self) -> int:
        return math.prod(self.grid) * math.prod(self.block)


@dataclass
class CudaFunction:
    """A `cuda.jit` kernel of the generated module: its arguments (flat arrays), body lines and launch."""

    name: str
    args: list[Array]
    lines: list[str]
    launch: Launch

    def source(self) -> str:
        doc = "; ".join(f"{a.arg}: {a.dtype.name}{list(a.shape)}" for a in self.args)
        head = ["@cuda.jit(cache=True)", f"def {self.name}({', '.join(a.arg for a in self.args)}):", f"    # {doc}"]
        return "\n".join(head + indent(self.lines))

    def launch_line(self, views=None) -> str:
        """The launcher's line starting this kernel on the flat views of its arguments."""
        views = views or [flat_view(a) for a in self.args]
        return f"{self.name}{self.launch.text}({', '.join(views)})"


def flat_view(a: Array) -> str:
    """The launcher's expression for a's flat device view (in3 -> ins[3].reshape(-1))."""
    if a.arg.startswith("out"):
        return f"outs[{a.arg[3:]}].reshape(-1)"
    return f"ins[{a.arg[2:]}].reshape(-1)"


class CudaKernelBuilder(KernelBuilder):
    """KernelBuilder (arguments in0.. out0.., values named by position, the scalar pass) with the CUDA dialect;
    `functions` holds CudaFunctions and `launch` the host launcher's lines."""

    def __init__(self, kernel):
        super().__init__(kernel)
        if has_symbols([a.shape for a in self.ins + self.outs]) or has_symbols(tuple(kernel.shape)):
            raise Unsupported("CUDA kernels are generated for static sizes only")
        self.dialect = CudaDialect()
        self.body = ScalarBody(self.dialect, self.value_name)

    def unique_args(self, arrays: list[Array]) -> list[Array]:
        """The arrays as kernel arguments: one read and written in place is one argument (its last role names it)."""
        unique: dict[str, Array] = {}
        for a in arrays:
            unique.pop(a.arg, None)
            unique[a.arg] = a
        return list(unique.values())


def elementwise_launch(numel: int) -> Launch:
    """A 1-D grid-stride launch over numel elements: up to THREADS threads a block (whole warps), enough blocks for
    one element a thread up to MAX_BLOCKS."""
    threads = min(THREADS, max(WARP, -(-numel // WARP) * WARP))
    return Launch((max(1, min(MAX_BLOCKS, -(-numel // threads))),), (threads,))


def elementwise_function(kb: CudaKernelBuilder, fname: str, nodes, ins, outs, shape) -> CudaFunction:
    """The elementwise skeleton: a grid-stride loop over the flat index i of `shape`, loads at broadcast offsets,
    the scalar body, stores."""
    arrays = ins + outs
    numel = math.prod(shape)
    index_lines, offsets = emit_offsets(shape, [a.strides_in(shape) for a in arrays], "i", "i_")
    refs = [f"{a.arg}[{shifted(off, a.offset)}]" for a, off in zip(arrays, offsets)]
    _, loads, body, stores, _ = kb.scalar_pass(ins, outs, refs, set(), nodes)
    lines = [f"for i in range(cuda.grid(1), {numel}, cuda.gridsize(1)):"]
    lines += indent(index_lines + loads + body + stores)
    return CudaFunction(fname, kb.unique_args(arrays), lines, elementwise_launch(numel))


def gen_elementwise(kb: CudaKernelBuilder) -> None:
    """An elementwise kernel: one grid-stride kernel over the kernel's shape."""
    shape = check_elementwise_nodes(kb.kernel)
    f = elementwise_function(kb, kb.name, kb.kernel.nodes, kb.reads, kb.outs, shape)
    kb.functions.append(f)
    kb.launch = [f.launch_line()]
