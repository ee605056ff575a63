"""Write real SQLite files in the nsys export schema for the analyzer tests.

The tables come from the reference DDL (tests/data/nsys-nvtx-min-schema.sql); `old=True` drops the
columns that 2024-era exports lack (eventId, binaryData, ...), as the schema note says to.
"""
from __future__ import annotations

import re
import sqlite3
from pathlib import Path

DDL_PATH = Path(__file__).parent / "data" / "nsys-nvtx-min-schema.sql"
PUSH_POP, START_END, MARK, THREAD, DOMAIN_CREATE = 59, 60, 34, 39, 75


def ddl(old: bool = False) -> str:
    text = DDL_PATH.read_text()
    if not old:
        return text
    text = "\n".join(line for line in text.splitlines() if "[new>=2025/26]" not in line)
    return re.sub(r",(\s*(--[^\n]*)?\n\);)", r"\1", text)


def global_tid(pid: int, tid: int, vm: int = 1) -> int:
    """nsys' serialized thread id: <HW:8><VM:8><PID:24><TID:24>."""
    return (vm << 48) | (pid << 24) | tid


class NsysFile:
    """A growing nsys-schema SQLite file; call `close()` (or use `with`) to write it."""

    def __init__(self, path, old: bool = False, nvtx: bool = True):
        self.path = str(path)
        self.old = old
        self.con = sqlite3.connect(self.path)
        script = ddl(old)
        if not nvtx:
            script = re.sub(r"CREATE TABLE NVTX_EVENTS \(.*?\n\);", "", script, flags=re.S)
        self.con.executescript(script)
        self._strings: dict[str, int] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self.con.commit()
        self.con.close()

    def string(self, value: str) -> int:
        sid = self._strings.get(value)
        if sid is None:
            sid = self._strings[value] = len(self._strings) + 1
            self.con.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (sid, value))
        return sid

    def event(self, event_type: int, name: str | None, start: int, end: int | None, pid: int,
              tid: int, *, registered: bool | None = None, domain: int = 0,
              end_tid: int | None = None) -> int:
        """Insert one NVTX_EVENTS row; the name goes to textId (registered) or text."""
        registered = (not self.old) if registered is None else registered
        text_id = self.string(name) if (registered and name is not None) else None
        text = None if registered else name
        end_gtid = None if end_tid is None else global_tid(pid, end_tid)
        cur = self.con.execute(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, endGlobalTid, "
            "textId, domainId) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (start, end, event_type, text, global_tid(pid, tid), end_gtid, text_id, domain))
        return cur.lastrowid

    def range(self, name: str, start: int, end: int | None, pid: int = 100, tid: int | None = None,
              **kw) -> int:
        return self.event(PUSH_POP, name, start, end, pid, pid if tid is None else tid, **kw)

    def start_end(self, name: str, start: int, end: int | None, pid: int = 100,
                  tid: int | None = None, **kw) -> int:
        return self.event(START_END, name, start, end, pid, pid if tid is None else tid, **kw)

    def mark(self, name: str, t: int, pid: int = 100, tid: int | None = None, **kw) -> int:
        return self.event(MARK, name, t, None, pid, pid if tid is None else tid, **kw)

    def domain(self, domain_id: int, name: str, pid: int = 100, t: int = 0) -> int:
        """A domain-create row (type 75, NULL end): domain ids are per process."""
        return self.event(DOMAIN_CREATE, name, t, None, pid, pid, domain=domain_id)

    def thread_name(self, name: str, pid: int, tid: int, event: bool = False) -> None:
        """Name a thread through the ThreadNames table or, with `event`, an NvtxThread row."""
        if event:
            self.event(THREAD, name, 0, None, pid, tid, registered=False)
        else:
            self.con.execute("INSERT INTO ThreadNames (nameId, priority, globalTid) VALUES (?, ?, ?)",
                             (self.string(name), 0, global_tid(pid, tid)))

    def process(self, pid: int, name: str) -> None:
        self.con.execute("INSERT INTO PROCESSES (globalPid, pid, name) VALUES (?, ?, ?)",
                         (global_tid(pid, 0), pid, name))
