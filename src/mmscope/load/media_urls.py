"""How `mmscope load` sends its images (`--media`): inline as base64 data URLs, or as http URLs
of a media server it runs on loopback (load/media_server.py), as clients link them; and what a
level shows of it: fetch and decode time by source against the time to first token, and the
fetches and bytes planned against those the media server answered and the server counted.
"""
from __future__ import annotations

from dataclasses import dataclass

from mmscope import stages
from mmscope.load.observed import series
from mmscope.load.client import Url, json_text
from mmscope.load.images import IMAGE_FORMATS
from mmscope.load.plan import LevelPlan, PlannedRequest, Workload

DATA_URL, HTTP = "data_url", "http"
SOURCES = (DATA_URL, HTTP)


@dataclass(frozen=True)
class MediaOptions:
    sources: tuple[str, ...] = (DATA_URL,)  # requests take them in turn
    latency_s: float = 0.0
    jitter_s: float = 0.0
    vary_urls: bool = False  # each request its own URL for each image, repeats too

    def source(self, request: PlannedRequest) -> str:
        return self.sources[request.index % len(self.sources)]

    @property
    def http(self) -> bool:
        return HTTP in self.sources


class Urls:
    """Each request's image URLs: data URLs, or URLs the media server answers (None without
    http). A repeat's URL is its image's, unless `vary_urls`: then each request has its own."""

    def __init__(self, workload: Workload, options: MediaOptions, media_server=None):
        self.workload, self.options, self.server = workload, options, media_server
        self.names: dict[int, list[str]] = {}  # level -> names served

    def of(self, plan: LevelPlan, request: PlannedRequest) -> list[Url]:
        """In the form request bodies take them in."""
        if self.options.source(request) == DATA_URL:
            return [self.workload.data_url(plan.level, i) for i in request.images]
        return [self._served(plan.level, i, request.index) for i in request.images]

    def _served(self, level: int, image: int, index: int) -> Url:
        fmt = self.workload.image_format
        suffix = f"-r{index}" if self.options.vary_urls else ""
        name = f"{self.workload.seed}-{level}-{image}{suffix}.{fmt}"
        self.names.setdefault(level, []).append(name)
        return json_text(self.server.add(name, self.workload.image_file(level, image),
                                         IMAGE_FORMATS[fmt]))

    def planned(self, plan: LevelPlan) -> tuple[int, int]:
        """The http fetches of the level and their bytes: one per http image sent (a server
        without a URL-keyed cache fetches a repeated URL again)."""
        images = [i for r in plan.requests if self.options.source(r) == HTTP for i in r.images]
        return len(images), sum(len(self.workload.image_file(plan.level, i)) for i in images)

    def forget(self, level: int) -> None:
        if self.server is not None:
            self.server.forget(self.names.pop(level, []))


@dataclass(frozen=True)
class Fetches:
    """A level's http fetches: planned, answered by the media server, counted by the server."""

    planned: int
    planned_bytes: int
    served: int
    served_bytes: int
    counted: int  # the server's mm:media:fetch:http:* samples
    counted_bytes: int

    def text(self) -> str:
        if self.planned == self.served == self.counted and \
                self.planned_bytes == self.served_bytes == self.counted_bytes:
            return f"fetches match the plan ({self.planned} fetches, {self.planned_bytes} bytes)"
        return (f"{self.planned} fetches of {self.planned_bytes} bytes planned, the media server "
                f"answered {self.served} ({self.served_bytes} bytes), the server counted "
                f"{self.counted} ({self.counted_bytes} bytes): a cache by URL in front of it "
                "(VLLM_MEDIA_CACHE), or other traffic")


def stage_samples(delta: dict[str, float]):
    """(sum or count, step, source, modality, value) of the level's media stages."""
    prefix = series.STAGES + "_"
    for key, value in delta.items():
        if key.startswith(prefix):
            kind, _, stage = key[len(prefix):].partition("{stage=")
            parsed = stages.parse_media_range(stage.removesuffix("}"))
            if parsed and kind in ("sum", "count"):
                yield kind, *parsed, value


def fetches(delta: dict[str, float], planned: tuple[int, int], served: tuple[int, int]) -> Fetches:
    counted = sum(value for kind, step, source, _, value in stage_samples(delta)
                  if kind == "count" and step == stages.MEDIA_FETCH and source == HTTP)
    counted_bytes = sum(v for k, v in delta.items()
                        if k.startswith(series.MEDIA_BYTES + "{") and f"source={HTTP}" in k)
    return Fetches(*planned, *served, int(round(counted)), int(round(counted_bytes)))


def by_source(delta: dict[str, float]) -> dict[str, dict]:
    """Per source the server saw in the level: items fetched, fetch and decode seconds (sum
    over modalities), bytes, fetches the processor cache made pointless and their seconds."""
    found: dict[str, dict] = {}
    for kind, step, source, _, value in stage_samples(delta):
        found.setdefault(source, empty_source())[f"{step}_{kind}"] += value
    for source, entry in found.items():
        for name, key in (("bytes", series.MEDIA_BYTES), ("redundant", series.MEDIA_REDUNDANT),
                          ("redundant_s", series.MEDIA_REDUNDANT_S),
                          ("failed", series.MEDIA_FAILED)):
            entry[name] = sum(v for k, v in delta.items()
                              if k.startswith(key + "{") and f"source={source}" in k)
    return {s: e for s, e in found.items() if e["fetch_count"] or e["failed"]}


def empty_source() -> dict:
    return {"fetch_sum": 0.0, "fetch_count": 0.0, "decode_sum": 0.0, "decode_count": 0.0}
