"""The chunk loop: every unfinished chunk of a run computed and written atomically, several at once in a window.

A chunk is the unit a run resumes from. A window is the unit it decodes in: the unfinished chunks of one window
are computed together by a runner that can (`run_window`), so that a stage's decoding batches gather the prompts
of every chunk in it and are limited by the device's memory, not by a chunk's size. Each chunk is still written
by itself, as soon as its window is done: a crash loses the window it was in, never a written chunk. The window is
not part of the run's identity (rollouts are seeded per row; the reads are those of any batching), so a run may
resume under another window, e.g. a smaller one after running out of memory.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Sequence

from contract.tables import Table
from engine.errors import NonFiniteLogitsError, ReadoutError

WINDOW_DEFAULT = {"cuda": 8}
"""Chunks decoded together by default, per device type (others: 1). On a GPU the paper profile's 4-scenario
chunks alone give the rider's 2,048-token decode batches of 32 rows; eight chunks give up to 256, as far as the
key/value limit allows (up to 240 for an 8B model with grouped-query attention on an H200: bench/results/plan_8b.md)."""


class Interrupted(Exception):
    """Raised by the stop_after_chunks testing aid, as a kill would stop the run."""


def window_for(requested: int | None, device_type: str, windowed: bool, what: str) -> int:
    """The run's window: `requested` (--window), else the device's default; 1 where the run computes one chunk at
    a time (`windowed` False: an explicit --window above 1 is refused, naming `what` runs so)."""
    if requested is not None and requested < 1:
        raise ReadoutError(f"--window: {requested} must be at least 1")
    if not windowed:
        if requested is not None and requested > 1:
            raise ReadoutError(f"--window: {what} computes one chunk at a time; use --window 1")
        return 1
    return requested if requested is not None else WINDOW_DEFAULT.get(device_type, 1)


def windows(chunks: Sequence[list], window: int, world: int = 1) -> list[list]:
    """The records of each window a fresh run computes, concatenated (for `--plan` and the manifest): with
    `world` processes sharing the chunks (ranks, each computing every world-th chunk), each rank's in turn."""
    out = []
    for rank in range(world):
        mine = list(chunks[rank::world])
        out += [[r for chunk in mine[i : i + window] for r in chunk] for i in range(0, len(mine), window)]
    return out


def chunk_loop(rundir, chunks, runner, contracts: Sequence[Table], log, stop_after: int | None = None,
               shard=(0, 1), locked: bool = False, window: int = 1) -> int:
    """Compute every unfinished chunk of this shard, `window` at a time, and write each atomically; returns how many
    were computed now.

    A chunk whose files are there but do not prove to be this run's chunk (unreadable, another run's or
    index's, rows dropped) is moved aside and recomputed. `locked`: several processes share the run
    directory (shards, ranks), so each chunk is locked while it is computed.
    """
    computed, pending = 0, []
    rank, world = shard

    def flush():
        nonlocal computed
        todo = list(pending)
        if stop_after is not None:
            if computed >= stop_after:
                raise Interrupted(f"stopped after {computed} chunks (testing aid)")
            todo = todo[: stop_after - computed]
        with ExitStack() as held:
            if locked:
                for i, _ in todo:
                    held.enter_context(rundir.chunk_lock(i))
            t0 = time.perf_counter()
            try:
                outs = _compute(runner, [chunk for _, chunk in todo])
            except NonFiniteLogitsError as exc:  # said with the chunks it stopped in; those written before are kept
                which = ", ".join(f"{i + 1}/{len(chunks)}" for i, _ in todo)
                raise NonFiniteLogitsError(f"chunk{'s' if len(todo) > 1 else ''} {which}: {exc}") from None
            took = time.perf_counter() - t0
            for (i, chunk), out in zip(todo, outs, strict=True):
                frames = tuple(t.frame(rows) for t, rows in zip(contracts, out, strict=True))
                rundir.write_chunk(i, frames, [r.id for r in chunk])
                computed += 1
                how = f"in {took:.1f} s" if len(todo) == 1 else f"(window of {len(todo)} chunks, {took:.1f} s)"
                log(f"chunk {i + 1}/{len(chunks)}: computed {len(frames[0])} rows {how}")
        if len(todo) < len(pending):  # the testing aid stopped inside the window
            raise Interrupted(f"stopped after {computed} chunks (testing aid)")
        pending.clear()

    for i, chunk in enumerate(chunks):
        if i % world != rank:
            continue
        why = rundir.problem(i, [r.id for r in chunk])
        if why is None:
            log(f"chunk {i + 1}/{len(chunks)}: already finished, skipped")
            continue
        if why != "missing":
            rundir.reject(i)
            log(f"chunk {i + 1}/{len(chunks)}: {why}; moved to {rundir.chunks / 'rejected'} and recomputed")
        pending.append((i, chunk))
        if len(pending) >= window:
            flush()
    if pending:
        flush()
    return computed


def _compute(runner, chunks: list[list]) -> list[tuple]:
    """Each chunk's tables: computed together where the runner can, else one chunk at a time."""
    if len(chunks) > 1:
        outs = runner.run_window(chunks)
        if len(outs) != len(chunks):
            raise RuntimeError(f"{type(runner).__name__}.run_window returned {len(outs)} chunks for {len(chunks)}")
        return outs
    return [runner.run(chunks[0])]
