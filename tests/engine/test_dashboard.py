"""Every metric the Grafana dashboard queries exists on a live /metrics of the tiny-model server."""
from __future__ import annotations

import json
import os
import re

import httpx
import pytest

from tests.kit.server import chat

DASHBOARD = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "dashboards", "mmscope.json")


def queried_metrics() -> set[str]:
    with open(DASHBOARD) as f:
        dash = json.load(f)
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs.append(dash["templating"]["list"][0]["query"])
    return set(re.findall(r"vllm:[a-z_]+", " ".join(exprs)))


def test_dashboard_is_valid_grafana_json():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    assert dash["uid"] and len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    assert {"vllm:encoder_cache_hits_by_source_total", "vllm:mm_cache_hits_total",
            "vllm:encoder_cache_usage_embeds", "vllm:mm_stage_duration_seconds_bucket",
            "vllm:encoder_cache_deferrals_total"} <= queried_metrics()


@pytest.mark.vllm
def test_every_queried_metric_is_on_live_metrics(traced_server):
    srv = traced_server
    chat(srv.url, srv.model, [901, 901], "Twice?")  # a hit, so every labelled series exists
    text = httpx.get(srv.url + "/metrics").text
    exposed = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
               if line.startswith("vllm:")}
    missing = queried_metrics() - exposed
    assert not missing, f"dashboard queries metrics the server does not expose: {missing}"
