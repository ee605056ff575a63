"""Benchmark of `mmscope analyze` on a large nsys-schema SQLite file (DESIGN §8).

Generates N NVTX rows (cached under /tmp), then times a bare SQLite scan and the analyzer side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from mmscope import stages

REPO = Path(__file__).resolve().parent.parent
DDL = REPO / "tests" / "data" / "nsys-nvtx-min-schema.sql"
PUSH_POP, MARK = 59, 34
# Columns the analyzer reads; the bare scan reads the same ones.
SCAN_SQL = ("SELECT start, end, eventType, globalTid, endGlobalTid, textId, text, domainId "
            "FROM NVTX_EVENTS")

# One worker step after its step_meta: (name, start offset, duration) in ns, all scaled per step.
# The preprocess children are an encoder run (load, vit_forward, save) or a cache hit (load,
# prepare); forward time grows with the step's tokens.
ENCODER_STEP = ((stages.PREPROCESS, 0, 40_000), (stages.EC_LOAD, 1_000, 1_000),
                (stages.VIT_FORWARD, 3_000, 20_000), (stages.EC_SAVE, 24_000, 5_000),
                (stages.GATHER_MM_EMBEDDINGS, 30_000, 4_000),
                (stages.EMBED_INPUT_IDS, 35_000, 3_000))
HIT_STEP = ((stages.PREPROCESS, 0, 20_000), (stages.EC_LOAD, 1_000, 3_000),
            (stages.PREPARE_MM_INPUTS, 5_000, 2_000), (stages.EC_LOAD, 8_000, 1_000),
            (stages.GATHER_MM_EMBEDDINGS, 10_000, 4_000), (stages.EMBED_INPUT_IDS, 15_000, 3_000))
ROWS_PER_STEP = 9  # step_meta + 6 preprocess rows + forward + postprocess
STEP_PERIOD = 200_000
FORWARD_BASE, FORWARD_PER_TOKEN = 20_000, 10
WORKER_PIDS = (2001, 2002, 2003, 2004)


def _step_rows(n_steps: int, rng: np.random.Generator):
    """Columns (start, end, name index), step by step, and each step's (prefill, decode)."""
    names = [None] + sorted({n for n, _, _ in ENCODER_STEP + HIT_STEP}
                            | {stages.FORWARD, stages.POSTPROCESS})
    index = {n: i for i, n in enumerate(names)}
    enc = rng.random(n_steps) < 0.4
    base = np.arange(n_steps, dtype=np.int64) * STEP_PERIOD
    scale = rng.uniform(0.8, 1.2, n_steps)
    prefill = np.where(rng.random(n_steps) < 0.3, rng.integers(1, 4096, n_steps), 0)
    decode = rng.integers(0, 256, n_steps)
    starts, ends, ids = [base], [base], [np.zeros(n_steps, np.int64)]  # the step_meta slot
    for (n_e, s_e, d_e), (n_h, s_h, d_h) in zip(ENCODER_STEP, HIT_STEP):
        off = (np.where(enc, s_e, s_h) * scale).astype(np.int64)
        dur = (np.where(enc, d_e, d_h) * scale).astype(np.int64)
        starts.append(base + 1_000 + off)
        ends.append(base + 1_000 + off + dur)
        ids.append(np.where(enc, index[n_e], index[n_h]))
    fwd_start = base + 1_000 + (np.where(enc, 42_000, 22_000) * scale).astype(np.int64)
    fwd_end = fwd_start + FORWARD_BASE + FORWARD_PER_TOKEN * (prefill + decode)
    starts += [fwd_start, fwd_end + 1_000]
    ends += [fwd_end, fwd_end + 5_000]
    ids += [np.full(n_steps, index[stages.FORWARD]), np.full(n_steps, index[stages.POSTPROCESS])]
    cols = [np.stack(c, 1).ravel() for c in (starts, ends, ids)]
    return (*cols, names, prefill, decode)


def generate(path: Path, rows: int, seed: int = 0) -> None:
    """Write about `rows` NVTX rows in the new nsys schema (textId + StringIds, eventId)."""
    rng = np.random.default_rng(seed)
    n_steps = max(rows // ROWS_PER_STEP, 1)
    start, end, name_idx, names, prefill, decode = _step_rows(n_steps, rng)
    con = sqlite3.connect(path)
    con.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;" + DDL.read_text())
    shapes = sorted(set(zip(prefill.tolist(), decode.tolist())))
    strings = [(i + 1, n) for i, n in enumerate(names[1:])]
    meta_id = {sh: len(strings) + 1 + i for i, sh in enumerate(shapes)}
    strings += [(meta_id[(p, d)], stages.step_meta_range(stages.StepShape(p, d, p + d, 1)))
                for p, d in shapes]
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", strings)
    text_id = name_idx.copy()
    text_id[name_idx == 0] = [meta_id[sh] for sh in zip(prefill.tolist(), decode.tolist())]
    # Steps are dealt round-robin to the worker processes, each on its main thread (tid == pid).
    pid = np.repeat(np.array(WORKER_PIDS, np.int64)[np.arange(n_steps) % len(WORKER_PIDS)],
                    ROWS_PER_STEP)
    gtid = (1 << 48) | (pid << 24) | pid
    order = np.argsort(start, kind="stable")  # nsys writes rows roughly in time order
    cols = [start[order], end[order], gtid[order], text_id[order]]
    con.executemany(
        "INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, textId, domainId) "
        f"VALUES (?, ?, {PUSH_POP}, ?, ?, 0)", zip(*(c.tolist() for c in cols)))
    con.commit()
    con.close()


def cached_file(rows: int) -> Path:
    path = Path(f"/tmp/mmscope-analyze-bench-v2-{rows}.sqlite")
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        t = time.perf_counter()
        generate(tmp, rows)
        os.replace(tmp, path)
        print(f"generated {path} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return path
