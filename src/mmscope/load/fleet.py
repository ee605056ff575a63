"""One plan over many instances and processes: the plan's lanes dealt to shards (`--shard K/N`)
and, within a shard, to its instances (`--url` repeated); and, for requests a router spread, the
hits an image-affine router and an image-ignorant one would give.

Every sight of an image lies in one lane, so a shard holds every sight of its images and an
instance every sight of the images sent to it: the planned hits stay exact under the spread.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from mmscope.load.plan import LevelPlan, PlannedRequest


@dataclass(frozen=True)
class Shard:
    index: int  # 0-based; `--shard K/N` is index K-1 of N
    count: int = 1

    def lanes(self, instances: int) -> int:
        """Lanes of the whole plan: one for each instance of each shard."""
        return self.count * instances

    def holds(self, lane: int) -> bool:
        return lane % self.count == self.index

    def part(self, plan: LevelPlan, instances: int) -> LevelPlan:
        return plan.part({lane for lane in range(self.lanes(instances)) if self.holds(lane)})

    def instance(self, request: PlannedRequest, instances: int) -> int:
        """Which of the shard's instances a request of its part goes to."""
        return request.lane // self.count % instances

    def spread(self, plan: LevelPlan, instances: int) -> list[LevelPlan]:
        """The shard's part of `plan`, instance by instance."""
        return [LevelPlan(plan.level, plan.reuse,
                          tuple(r for r in plan.requests if self.instance(r, instances) == i))
                for i in range(instances)]


@dataclass(frozen=True)
class Bounds:
    """Hits of the plan's repeats under a router over `instances`, without evictions."""

    instances: int
    affine: int  # a router that keeps each image on one instance: every repeat hits
    ignorant: float  # one that ignores images, each request to an instance drawn at random
    fewest: int  # the fewest any router gives: an image seen k times misses on at most
    #              `instances` of them

    def text(self) -> str:
        return (f"over {self.instances} instances an image-affine router gives {self.affine} "
                f"hits, an image-ignorant one about {self.ignorant:.0f} (at least {self.fewest})")

    def json(self) -> dict:
        return {"instances": self.instances, "affine_hits": self.affine,
                "ignorant_hits": round(self.ignorant, 1), "fewest_hits": self.fewest}


def bounds(plan: LevelPlan, instances: int) -> Bounds:
    """An image sent k times hits k - 1 times on an image-affine router; on one drawing an
    instance at random, k less the instances it reaches, M (1 - (1 - 1/M)^k) expected."""
    sights = Counter(image for request in plan.requests for image in request.images)
    m = instances
    ignorant = sum(k - m * (1 - (1 - 1 / m) ** k) for k in sights.values())
    fewest = sum(max(k - m, 0) for k in sights.values())
    return Bounds(m, plan.planned_hits, ignorant, fewest)
