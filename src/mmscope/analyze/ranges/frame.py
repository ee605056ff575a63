"""The analysis frame: a range table registered in DuckDB with each range's node in the stage tree,
its self time and device time, the stages, the processes and their roles; what every computation
reads.

Built once per analysis, in compiled passes over the rows (tree.py, figures.py, device.py); what
reads only the table can start once its catalogue rows are found (`begin`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mmscope import stages
from mmscope.analyze.ranges import device, families, processes, steps, tree
from mmscope.analyze.ranges.table import RangeTable


@dataclass
class Frame:
    table: RangeTable
    stages: list[str] = None            # stage names (every step_meta name folded into one,
    stage_of_name: np.ndarray = None    # families); canonical name id -> stage id
    families: list = None               # per stage: (pattern, distinct names) of a family, or None
    processes: list[dict] = None        # processes.describe
    roles: list[str] = None             # role labels, in the order of the tree's roots
    nodes: tree.Nodes = None
    ranges: dict[str, np.ndarray] = None  # per row: node, start, end, parent (+ device)
    kernels: dict[int, list[dict]] = None  # per stage id, its top kernels (none: no device side)
    device: device.PerRange | None = None  # the device time of the ranges (None: no device side)


def build(table: RangeTable, raw_names: bool = False) -> Frame:
    """`ranges` holds every range: node, start, end, parent row; `device` the device time of
    the ranges where the profile has a device side (device.per_range). Names that differ only
    in numbers are one stage (families.py) unless `raw_names`."""
    frame = complete(begin(table), raw_names)
    if table.device is not None:
        project(frame, device.per_range(table))
    return frame


def begin(table: RangeTable) -> Frame:
    """The frame of a table whose catalogue rows are found: what the step join, the checks and
    the cache benefit read (they read the table only), before the stage tree is built."""
    table.find_rows((stages.FORWARD,), (stages.PREPROCESS,), (stages.VIT_FORWARD,),
                    (stages.EC_SAVE,), stages.PREPROCESS_SIBLINGS,
                    id_sets={steps.STEP_META_ROWS: steps.step_meta_shapes(table)[1]})
    return Frame(table=table)


def complete(frame: Frame, raw_names: bool = False) -> Frame:
    """The stages, processes and roles, and the stage tree, into `frame` (the device time
    follows: `project`)."""
    table = frame.table
    stage_list, stage_of_name, families_ = families.stage_names(table.names, raw_names)
    procs = processes.describe(table, stage_list, stage_of_name)
    roles = _role_order({p["role"] for p in procs})
    role_of_pid = {p["pid"]: roles.index(p["role"]) for p in procs}
    role_of_thread = np.array([role_of_pid.get(processes.pid_of(t), 0)
                               for t in table.threads.tolist()], np.int64)
    nodes = tree.build(table, stage_of_name, role_of_thread, len(stage_list), len(roles))
    ranges = {"node": nodes.of_row, "start": table.start, "end": table.end,
              "parent": table.parent}
    frame.stages, frame.stage_of_name, frame.families = stage_list, stage_of_name, families_
    frame.processes, frame.roles, frame.nodes = procs, roles, nodes
    frame.ranges, frame.kernels = ranges, {}
    return frame


def project(frame: Frame, projected: device.PerRange) -> None:
    """The device time of the ranges (device.per_range) and each stage's top kernels."""
    frame.device = projected
    frame.kernels = device.kernels_by_stage(frame.table.device, frame.nodes, frame.nodes.of_row)


def _role_order(labels: set[str]) -> list[str]:
    """API server first, then engine, then worker (by the first role a label names)."""
    def rank(label: str):
        first = label.split(" + ")[0]
        order = processes.ROLE_ORDER
        return (order.index(first) if first in order else len(order), label)
    return sorted(labels, key=rank)
