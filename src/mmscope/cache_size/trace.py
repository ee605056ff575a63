"""Read an encoder-cache access log (mmscope.carry.access_log's format) into compact per-engine event
lists for the cache model: integers only, one tuple per access or freed request.

An event is (request, key, embeds, outcome) with outcome MISS, HIT or CONNECTOR (what the log
recorded); a freed request is (request, FREE, 0, 0). DEFERRED lines are not accesses.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mmscope import vocabulary
from mmscope.errors import UserError
from mmscope.vocabulary import Outcome

FREE = -1
MISS, HIT, CONNECTOR = 0, 1, 2
OUTCOMES = {Outcome.MISS: MISS, Outcome.HIT: HIT, Outcome.DEFERRED: None}


@dataclass
class EngineTrace:
    """One engine's events in log order, its recorded capacity and what the log says it hit."""

    engine: str
    events: list[tuple[int, int, int, int]] = field(default_factory=list)
    capacity: int | None = None
    bytes_per_embed: int = 0  # 0: the log does not say
    accesses: int = 0
    hits: int = 0
    largest_item: int = 0

    def tally(self, embeds: int, outcome: int) -> None:
        if embeds <= 0:
            raise ValueError(embeds)
        self.accesses += 1
        self.hits += outcome != MISS
        if embeds > self.largest_item:
            self.largest_item = embeds


@dataclass
class Trace:
    path: str
    engines: dict[str, EngineTrace]
    lines: int = 0

    @property
    def accesses(self) -> int:
        return sum(e.accesses for e in self.engines.values())

    @property
    def bytes_per_embed(self) -> int | None:
        """One embedding's bytes as the engines recorded them, where they did and agree."""
        known = {e.bytes_per_embed for e in self.engines.values() if e.bytes_per_embed}
        return known.pop() if len(known) == 1 else None


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
        # One tight loop: a million lines should read in about a second.
        for n, line in enumerate(f, 1):
            p = line.split("\t")
            kind = p[0]
            if kind == "A" and len(p) == 10:
                outcome = OUTCOMES[p[8]]
                if outcome is None:  # DEFERRED: committed again when it is really scheduled
                    continue
                if outcome and p[9].rstrip("\n") == vocabulary.CONNECTOR:
                    outcome = CONNECTOR
                embeds = int(p[7])
                e = engines.get(p[2]) or _engine(engines, p[2])
                e.events.append((requests.setdefault(p[3], len(requests)),
                                 keys.setdefault(p[6], len(keys)), embeds, outcome))
                e.tally(embeds, outcome)
            elif kind == "F" and len(p) == 4:
                e = engines.get(p[2]) or _engine(engines, p[2])
                e.events.append((requests.setdefault(p[3].rstrip("\n"), len(requests)), FREE, 0, 0))
            elif kind == "C" and len(p) in (4, 5):
                e = engines.get(p[2]) or _engine(engines, p[2])
                e.capacity = int(p[3])
                e.bytes_per_embed = int(p[4]) if len(p) == 5 else 0
            elif not (kind.startswith("#") or line.isspace()):
                raise ValueError(kind)
    except UnicodeDecodeError:
        raise
    except (ValueError, IndexError, KeyError):
        if line.endswith("\n") or n == 1:
            raise UserError(_bad_line(path, n, engines)) from None
        # A last line without its newline: a copy taken while an engine was writing.
    return Trace(path, engines, n)


def _bad_line(path: str, n: int, engines: dict) -> str:
    if not engines:
        return f"{path}:{n}: not an encoder-cache access log (see MMSCOPE_ACCESS_LOG)"
    return f"{path}:{n}: not an access-log line"


def _engine(engines: dict[str, EngineTrace], name: str) -> EngineTrace:
    e = engines[name] = EngineTrace(name)
    return e
