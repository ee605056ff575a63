"""The processes and threads of a profile, named where the profile names them, and each process'
role in vLLM's pipeline (API server, engine, worker): the roots of the stage tree.

A process title says engine or worker (vLLM's `VLLM::EngineCore`, `VLLM::Worker`,
`VllmWorker-0`); the catalogue ranges a process holds say worker or API server.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from mmscope import stages

API_SERVER, ENGINE, WORKER = "API server", "engine", "worker"
ROLE_ORDER = (API_SERVER, ENGINE, WORKER)
# vLLM's process titles (nsys keeps 15 characters of them: "VLLM::EngineCor").
TITLES = (("EngineCor", ENGINE), ("Worker", WORKER))
WORKER_STAGES = frozenset((stages.PREPROCESS, stages.FORWARD, stages.POSTPROCESS)
                          + stages.PREPROCESS_SIBLINGS)
API_PREFIXES = (stages.HASH_PREFIX, stages.PROCESSOR_PREFIX, stages.MEDIA_PREFIX)


def pid_of(thread: int) -> int:
    return (thread >> 24) & 0xFFFFFF


def tid_of(thread: int) -> int:
    return thread & 0xFFFFFF


def role_of(title: str | None, names: set[str]) -> str:
    """The roles of one process, joined: from its title and the worker ranges it holds; the
    multimodal processor's ranges mean API server only in a process no title names (engine
    and workers process a dummy input at start-up)."""
    found = {role for part, role in TITLES if title and part in title}
    if any(n in WORKER_STAGES or n == stages.STEP_META_STAGE for n in names):
        found.add(WORKER)
    titled = any(part in (title or "") for part, _ in TITLES)
    if not titled and any(n.startswith(API_PREFIXES) for n in names):
        found.add(API_SERVER)
    if not found:
        return title or "process"
    return " + ".join(r for r in ROLE_ORDER if r in found)


def describe(table, stage_names: list[str], stage_of_name: np.ndarray) -> list[dict]:
    """One entry per process, in pid order: pid, name, role, ranges, and its threads (tid,
    name, ranges) in tid order. `stage_of_name`: per name id, its stage."""
    n_stages = max(len(stage_names), 1)
    threads = table.threads
    if len(threads) * n_stages > 4 * len(table):  # many (thread, stage) pairs: the present ones
        key = (table.thread_index.astype(np.int64) * n_stages
               + stage_of_name[table.name_id])
        pairs, counts = np.unique(key, return_counts=True)
        del key
    else:
        counts = np.zeros(len(threads) * n_stages, np.int64)
        _count_pairs(table.group, table.n_subs, table.name_id, stage_of_name, n_stages, counts)
        pairs, counts = _present(counts)
    per_thread: dict[int, int] = {}
    names_of: dict[int, set[str]] = {}
    for pair, count in zip(pairs.tolist(), counts.tolist()):
        thread = int(threads[pair // n_stages])
        per_thread[thread] = per_thread.get(thread, 0) + count
        names_of.setdefault(pid_of(thread), set()).add(stage_names[pair % n_stages])
    out = []
    for pid in sorted(names_of):
        threads_ = sorted(t for t in per_thread if pid_of(t) == pid)
        title = table.process_names.get(pid)
        out.append({"pid": pid, "name": title, "role": role_of(title, names_of[pid]),
                    "ranges": sum(per_thread[t] for t in threads_),
                    "threads": [{"tid": tid_of(t), "name": table.thread_names.get(t),
                                 "ranges": per_thread[t]} for t in threads_]})
    return out


@njit(cache=True, nogil=True)
def _count_pairs(group, n_subs, name_id, stage_of_name, n_stages, counts):
    """counts[thread index * n_stages + stage]: the ranges of each (thread, stage)."""
    for i in range(len(group)):
        counts[group[i] // n_subs * n_stages + stage_of_name[name_id[i]]] += 1


def _present(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    at = np.flatnonzero(counts)
    return at, counts[at]
