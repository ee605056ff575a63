"""Read an encoder-cache access log (mmscope.access_log's format) into compact per-engine event
lists for the cache model: integers only, one tuple per access or freed request.

An event is (request, key, embeds, connector); a freed request is (request, FREE, 0, 0).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mmscope.errors import UserError

FREE = -1


@dataclass
class EngineTrace:
    """One engine's events in log order, its recorded capacity and what the log says it hit."""

    engine: str
    events: list[tuple[int, int, int, int]] = field(default_factory=list)
    capacity: int | None = None
    accesses: int = 0
    hits: int = 0
    largest_item: int = 0


@dataclass
class Trace:
    path: str
    engines: dict[str, EngineTrace]
    lines: int = 0

    @property
    def accesses(self) -> int:
        return sum(e.accesses for e in self.engines.values())


def load(path: str) -> Trace:
    """The log at `path`; bad input raises UserError with a one-line message."""
    try:
        with open(path, encoding="utf-8") as f:
            trace = _parse(f, path)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, not an access log") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not an encoder-cache access log (binary data)") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    if trace.accesses == 0:
        raise UserError(f"{path}: no encoder-cache accesses in the log (was MMSCOPE_ACCESS_LOG "
                        "set in vLLM's environment, and did requests with images run?)")
    return trace


def _parse(f, path: str) -> Trace:
    engines: dict[str, EngineTrace] = {}
    keys: dict[str, int] = {}
    requests: dict[str, int] = {}
    n, line = 0, ""
    try:
        for n, line in enumerate(f, 1):
            p = line.rstrip("\n").split("\t")
            kind = p[0]
            if kind == "A" and len(p) == 10:
                _access(engines, keys, requests, p)
            elif kind == "F" and len(p) == 4:
                _engine(engines, p[2]).events.append(
                    (requests.setdefault(p[3], len(requests)), FREE, 0, 0))
            elif kind == "C" and len(p) == 4:
                _engine(engines, p[2]).capacity = int(p[3])
            elif kind.startswith("#") or not line.strip():
                continue
            else:
                raise ValueError(kind)
    except UnicodeDecodeError:
        raise
    except (ValueError, IndexError):
        if line.endswith("\n") or n == 1:
            raise UserError(_bad_line(path, n, engines)) from None
        # A last line without its newline: a copy taken while an engine was writing.
    return Trace(path, engines, n)


def _bad_line(path: str, n: int, engines: dict) -> str:
    if not engines:
        return f"{path}:{n}: not an encoder-cache access log (see MMSCOPE_ACCESS_LOG)"
    return f"{path}:{n}: not an access-log line"


def _engine(engines: dict[str, EngineTrace], name: str) -> EngineTrace:
    e = engines.get(name)
    if e is None:
        e = engines[name] = EngineTrace(name)
    return e


def _access(engines, keys, requests, p: list[str]) -> None:
    outcome, embeds = p[8], int(p[7])
    if outcome == "DEFERRED":  # not an access: it is committed again when it is scheduled
        return
    if outcome not in ("HIT", "MISS") or embeds <= 0:
        raise ValueError(outcome)
    e = _engine(engines, p[2])
    connector = outcome == "HIT" and p[9] == "connector"
    e.events.append((requests.setdefault(p[3], len(requests)), keys.setdefault(p[6], len(keys)),
                     embeds, connector))
    e.accesses += 1
    e.hits += outcome == "HIT"
    if embeds > e.largest_item:
        e.largest_item = embeds
