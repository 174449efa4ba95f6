"""Producer processes for the uniqueness tests: each enqueues the same call many times, all
starting together, and reports the task ids it got back."""

from __future__ import annotations

import multiprocessing
from typing import Any

_barrier: Any = None


def _init(barrier: Any) -> None:
    global _barrier
    _barrier = barrier


def enqueue(task: str, args: tuple[Any, ...], count: int, by_name: bool) -> list[str]:
    import lockapp

    _barrier.wait(timeout=60)
    if by_name:
        return [lockapp.app.send_task(task, args).id for _ in range(count)]
    return [lockapp.app.tasks[task].delay(*args).id for _ in range(count)]


def burst(task: str, args: tuple[Any, ...], *, producers: int = 4, count: int = 100) -> list[str]:
    """Task ids from ``producers`` processes each enqueueing ``task(*args)`` ``count`` times;
    the odd-numbered producers send by name (``app.send_task``)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(producers)
    with ctx.Pool(producers, initializer=_init, initargs=(barrier,)) as pool:
        jobs = [(task, args, count, i % 2 == 1) for i in range(producers)]
        return [tid for ids in pool.starmap(enqueue, jobs) for tid in ids]
