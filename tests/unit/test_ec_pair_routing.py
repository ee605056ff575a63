"""`mmscope load --encoder-url`: the proxy's per-image requests to the encoder instance, the pair's
verdict on the PD instance's counts, one-line errors for bad URLs (the servers: test_epd.py)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mmscope.load.client import json_text
from mmscope.load.epd import PD, primers, with_pd
from mmscope.load.verdict import MATCH, UNEXPLAINED, Verdict
from tests.kit.cli import one_line_error


def image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def test_one_primer_per_image_with_the_text_removed_and_one_token():
    sent = [json.loads(p) for p in primers("m", [json_text("a"), json_text("b")])]
    assert [p["messages"] for p in sent] == [[{"role": "user", "content": [image(u)]}]
                                             for u in ("a", "b")]
    assert all(p["max_tokens"] == 1 and p["model"] == "m" and p["stream"] for p in sent)
    assert primers("m", []) == []


def pd_delta(queries, misses, connector, local, in_step=0, covered=0) -> dict[str, float]:
    return {PD + "encoder_cache_queries": queries, PD + "encoder_cache_misses": misses,
            PD + "encoder_cache_prefix_covered": covered,
            PD + "encoder_cache_hits_by_source{source=connector}": connector,
            PD + "encoder_cache_hits_by_source{source=local}": local,
            PD + "encoder_cache_hits_by_source{source=in_step}": in_step}


@pytest.mark.parametrize("delta,status,says", [
    (pd_delta(6, 0, 4, 2), MATCH, "PD instance: all 6 queries hits (2 local, 4 connector)"),
    (pd_delta(6, 1, 3, 2), UNEXPLAINED, "PD instance: 1 misses and 6 queries for 6 images"),
    (pd_delta(5, 0, 4, 1), UNEXPLAINED, "5 queries for 6 images"),
    (pd_delta(4, 0, 4, 0, covered=2), MATCH, "all 6 queries hits"),
])
def test_the_pair_verdict_needs_every_pd_query_to_be_a_hit(delta, status, says):
    verdict = with_pd(Verdict(MATCH, "hits match the plan (2 of 2)"), 6, delta)
    assert verdict.status == status and says in verdict.text
    assert verdict.text.startswith("hits match the plan (2 of 2); ")


def test_one_server_keeps_its_verdict():
    verdict = Verdict(MATCH, "hits match the plan (2 of 2)")
    assert with_pd(verdict, 6, {"encoder_cache_queries": 6}) is verdict


@pytest.mark.parametrize("url,says", [
    ("ftp://127.0.0.1:1", "--encoder-url must start with http:// or https://"),
    ("http://127.0.0.1:99999", "--encoder-url 'http://127.0.0.1:99999' is not a URL: Port out of "
                               "range"),
    ("http://", "--encoder-url 'http://' names no host"),
])
def test_a_bad_encoder_url_is_a_one_line_error(url, says):
    done = subprocess.run([sys.executable, "-m", "mmscope.load.command", "--url",
                           "http://127.0.0.1:1", "--encoder-url", url],
                          capture_output=True, text=True, timeout=60)
    assert says in one_line_error(done)


def test_an_unreachable_pair_is_a_one_line_error():
    done = subprocess.run([sys.executable, "-m", "mmscope.load.command", "--url",
                           "http://127.0.0.1:1", "--encoder-url", "http://127.0.0.1:2"],
                          capture_output=True, text=True, timeout=60)
    assert "cannot reach http://127.0.0.1:" in one_line_error(done)
