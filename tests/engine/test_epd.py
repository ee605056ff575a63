"""The encoder on its own instance (EPD): two OpenAI servers on loopback sharing one
ECExampleConnector folder, an encoder producer and a prefill/decode consumer, each request routed
as vLLM's disaggregated-encoder proxy routes it; exact counts and transfers on both. The PD
instance runs the test run's model runner, the encoder instance V1 (under V2, vLLM's encoder-only
instance fails in vLLM itself)."""
from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mmscope import stages
from mmscope.demo.serve import VllmServer
from mmscope.load.client import json_text
from mmscope.load.epd import primers
from mmscope.demo.tiny_llava import IMAGE_TOKENS
from tests.kit.item_ways import agree_with_the_counters, reading, saved, ways
from tests.kit.item_ways import settled as settled_ways
from tests.kit import otlp, runners, traces as tk
from tests.kit.prometheus import Prometheus
from tests.kit.server import data_url, histograms, metrics

pytestmark = [pytest.mark.vllm, pytest.mark.runners]

SETTLE_S = 10.0
DASHBOARD = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "dashboards", "mmscope.json")


def ec_config(role: str, shared) -> str:
    return json.dumps({"ec_connector": "ECExampleConnector", "ec_role": role,
                       "ec_connector_extra_config": {"shared_storage_path": str(shared)}})


@pytest.fixture(scope="module")
def pair(tiny_model, tmp_path_factory, otlp_receiver):
    """Producer as vLLM's 1e1pd example starts its encoder (prefix caching off), consumer as its
    PD instance; both traced, exporting vLLM's request spans, started side by side."""
    base = tmp_path_factory.mktemp("epd")
    shared = base / "ec_cache"
    shared.mkdir()
    servers = {}
    for name, role, extra in (("producer", "ec_producer", ["--no-enable-prefix-caching"]),
                              ("consumer", "ec_consumer", [])):
        servers[name] = VllmServer(
            tiny_model, str(base / f"{name}.log"),
            extra_args=[*extra, "--ec-transfer-config", ec_config(role, shared),
                        *otlp.server_args(otlp_receiver)],
            env={"MMSCOPE_TRACE": "chrome", "MMSCOPE_TRACE_DIR": str(base / f"{name}-traces"),
                 **otlp.SERVER_ENV, **(runners.V1_ONLY if role == "ec_producer" else {})})
        servers[name].trace_dir = base / f"{name}-traces"
    errors = []

    def start(server):
        try:
            server.start()
        except Exception as e:  # noqa: BLE001 - reported below, with the log's path
            errors.append(e)

    threads = [threading.Thread(target=start, args=(s,)) for s in servers.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors
        servers["shared"] = shared
        yield servers
    finally:
        for name in ("producer", "consumer"):
            servers[name].stop()


def body(model: str, image: int, text: str) -> dict:
    # Text first: prompts differ from their first token, so no prefix-cache hit covers an image.
    return {"model": model, "max_tokens": 3, "temperature": 0.0, "messages": [
        {"role": "user", "content": [{"type": "text", "text": text},
                                     {"type": "image_url", "image_url": {"url": data_url(image)}}]}]}


def route(pair, request: dict, headers: dict | None = None) -> dict:
    """The proxy's path: each image alone to the encoder instance (one token), then the request
    to the PD instance; `headers` on both legs."""
    images = [json_text(p["image_url"]["url"]) for p in request["messages"][0]["content"]
              if p["type"] == "image_url"]
    for primer in map(json.loads, primers(request["model"], images)):
        assert [p["type"] for p in primer["messages"][0]["content"]] == ["image_url"]
        assert primer["max_tokens"] == 1
        httpx.post(f"{pair['producer'].url}/v1/chat/completions", json=primer, headers=headers,
                   timeout=120).raise_for_status()
    r = httpx.post(f"{pair['consumer'].url}/v1/chat/completions", json=request, headers=headers,
                   timeout=120)
    r.raise_for_status()
    return r.json()


def settled(url: str, before: dict, key: str, want: int) -> dict:
    """The reading once `key` moved by `want` (the stats of the last step follow its answer)."""
    deadline = time.monotonic() + SETTLE_S
    now = metrics(url)
    while now.get(key, 0) - before.get(key, 0) < want and time.monotonic() < deadline:
        time.sleep(0.2)
        now = metrics(url)
    return {k: now.get(k, 0) - before.get(k, 0) for k in set(now) | set(before)}


def stage_counts(url: str) -> dict[str, float]:
    """Samples per stage of vllm:mm_stage_duration_seconds."""
    out = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        if family.name == "vllm:mm_stage_duration_seconds":
            for s in family.samples:
                if s.name.endswith("_count"):
                    out[s.labels["stage"]] = out.get(s.labels["stage"], 0) + s.value
    return out


def stored_bytes(shared) -> int:
    """What the producer wrote: the nbytes of each saved tensor, read back from its files."""
    from safetensors.torch import load_file

    return sum(load_file(str(f))["ec_cache"].nbytes for f in shared.glob("*/*.safetensors"))


def transfers(delta: dict, direction: str) -> tuple[int, int, float]:
    return tuple(delta.get(f"ec_connector_transfer_{kind}{{direction={direction}}}", 0)
                 for kind in ("items", "bytes", "seconds"))


TTFT_PARTS = "request_ttft_part_seconds"


def ttft_histograms(url: str) -> dict[str, float]:
    return histograms(url, TTFT_PARTS)


def part_count(delta: dict, outcome: str) -> float:
    return delta.get(f"{TTFT_PARTS}_count{{encoder_cache={outcome},part=other}}", 0)


def ttft_delta(url: str, before: dict, requests: int, timeout_s: float = 15) -> dict:
    """The TTFT split's delta once every request's split has arrived."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = ttft_histograms(url)
        delta = {k: now[k] - before.get(k, 0) for k in now}
        if part_count(delta, "hit") + part_count(delta, "miss") >= requests \
                or time.monotonic() > deadline:
            return delta
        time.sleep(0.2)


def test_transfer_series_exist_at_zero_with_native_labels(pair):
    for name in ("producer", "consumer"):
        text = httpx.get(pair[name].url + "/metrics").text
        for kind in ("items", "bytes", "seconds"):
            for direction in ("load", "save"):
                line = next(ln for ln in text.splitlines() if ln.startswith(
                    f"vllm:ec_connector_transfer_{kind}_total{{") and
                    f'direction="{direction}"' in ln)
                assert 'engine="0"' in line and f'model_name="{pair[name].model}"' in line


def test_scripted_sequence_through_the_pair(pair):
    producer, consumer = pair["producer"], pair["consumer"]
    p_before, c_before = metrics(producer.url), metrics(consumer.url)
    p_ttft_before, c_ttft_before = ttft_histograms(producer.url), ttft_histograms(consumer.url)
    for n, seed in enumerate([51, 52, 51]):
        assert route(pair, body(consumer.model, seed, f"Question {n}?"))["choices"]
    p = settled(producer.url, p_before, "encoder_cache_queries", 3)
    c = settled(consumer.url, c_before, "encoder_cache_queries", 3)

    # The encoder instance does the encoder work: two distinct images computed, the repeat a hit.
    assert (p["encoder_cache_queries"], p["encoder_cache_misses"], p["encoder_cache_hits"]) == \
        (3, 2, 1)
    # The PD instance: every query a hit, the first sight of each image from the connector.
    assert (c["encoder_cache_queries"], c["encoder_cache_misses"]) == (3, 0)
    assert c["encoder_cache_hits_by_source{source=connector}"] == 2
    assert c["encoder_cache_hits_by_source{source=local}"] == 1

    # Transfers: two items saved, the same two loaded, byte for byte what the files hold.
    saved = len(list(pair["shared"].glob("*/*.safetensors")))
    assert saved == 2
    nbytes = stored_bytes(pair["shared"])
    p_items, p_bytes, p_seconds = transfers(p, "save")
    c_items, c_bytes, c_seconds = transfers(c, "load")
    assert (p_items, p_bytes) == (2, nbytes) and p_seconds > 0
    assert (c_items, c_bytes) == (2, nbytes) and c_seconds > 0
    assert transfers(p, "load") == (0, 0, 0) and transfers(c, "save") == (0, 0, 0)

    # No encoder on the PD instance: no vit_forward sample or range, its loads timed instead.
    c_stages, p_stages = stage_counts(consumer.url), stage_counts(producer.url)
    assert c_stages[stages.VIT_FORWARD] == 0 and c_stages[stages.EC_LOAD] > 0
    assert p_stages[stages.VIT_FORWARD] > 0 and p_stages[stages.EC_SAVE] == 2
    # Time to first token: the encoder instance's two first sights are misses; on the PD instance
    # every request is a hit whose first token waited for no encoder, the two connector loads'
    # time its ec_load part.
    p_ttft = ttft_delta(producer.url, p_ttft_before, 3)
    c_ttft = ttft_delta(consumer.url, c_ttft_before, 3)
    assert (part_count(p_ttft, "miss"), part_count(p_ttft, "hit")) == (2, 1)
    assert (part_count(c_ttft, "miss"), part_count(c_ttft, "hit")) == (0, 3)
    assert c_ttft[f"{TTFT_PARTS}_sum{{encoder_cache=hit,part=encoder}}"] == 0
    assert c_ttft[f"{TTFT_PARTS}_sum{{encoder_cache=hit,part=ec_load}}"] > 0
    assert p_ttft[f"{TTFT_PARTS}_sum{{encoder_cache=miss,part=encoder}}"] > 0
    time.sleep(1.0)  # the traces are flushed every 0.5 s
    c_ranges, _ = tk.load(consumer.trace_dir)
    p_ranges, _ = tk.load(producer.trace_dir)
    assert tk.named(c_ranges, stages.EC_LOAD) and not tk.named(c_ranges, stages.VIT_FORWARD)
    assert len(tk.named(p_ranges, stages.EC_SAVE)) == 2 and tk.named(p_ranges, stages.VIT_FORWARD)


def test_each_items_way_through_the_pair(pair):
    """An image sent straight to the PD instance is computed there (its encoder's cost per
    embedding measured); one the proxy routes is computed by the encoder instance and loaded by
    the PD instance: counted ec_loaded, saving the PD instance's encoder time less the load's."""
    producer, consumer = pair["producer"], pair["consumer"]
    p_before, c_before = reading(producer.url), reading(consumer.url)
    httpx.post(f"{consumer.url}/v1/chat/completions", json=body(consumer.model, 81, "Direct?"),
               timeout=120).raise_for_status()
    route(pair, body(consumer.model, 82, "Routed?"))
    p = settled_ways(producer.url, p_before, 1)
    c = settled_ways(consumer.url, c_before, 2)
    assert ways(p) == ({"miss": 1}, {"computed": 1})
    assert ways(c) == ({"miss": 2}, {"computed": 1, "ec_loaded": 1})
    agree_with_the_counters(p), agree_with_the_counters(c)
    assert saved(c)["ec_connector"] > 0 and saved(c)["encoder_cache"] == 0


def test_one_trace_holds_what_the_encoder_instance_did_and_what_the_pd_instance_loaded(
        pair, otlp_receiver):
    """The proxy's trace context (W3C traceparent) on both legs: vLLM makes each instance's
    request span its child, so both lie in one trace; the encoder instance's computed the image,
    the PD instance's loaded it from the connector, its first token waiting for no encoder."""
    producer, consumer = pair["producer"], pair["consumer"]
    trace_id, proxy_span = secrets.token_hex(16), secrets.token_hex(8)
    answer = route(pair, body(consumer.model, 71, "Traced?"),
                   headers={"traceparent": f"00-{trace_id}-{proxy_span}-01"})

    def in_trace(spans):
        return [s for s in spans if s.trace_id == trace_id and s.name == otlp.REQUEST]

    spans = otlp_receiver.wait_for(lambda got: len(in_trace(got)) == 2)
    by_server = {s.resource["vllm.process_id"]: s for s in in_trace(spans)}
    encoder, pd = by_server[str(producer.proc.pid)], by_server[str(consumer.proc.pid)]
    assert encoder.parent_id == pd.parent_id == proxy_span
    assert pd.attributes["gen_ai.request.id"] == answer["id"]
    assert {k: v for k, v in otlp.multimodal(encoder).items() if v} == {
        "items.image": 1, "encoder_cache.misses": 1, "embeddings.computed": IMAGE_TOKENS}
    assert {k: v for k, v in otlp.multimodal(pd).items() if v} == {
        "items.image": 1, "encoder_cache.hits.connector": 1, "embeddings.spared": IMAGE_TOKENS}
    encoder_parts, pd_parts = otlp.parts(spans, encoder), otlp.parts(spans, pd)
    assert "encoder" in encoder_parts and "ec_load" not in encoder_parts
    assert pd_parts["ec_load"] > 0 and "encoder" not in pd_parts


def test_mmscope_load_verifies_a_reuse_sweep_through_the_pair(pair):
    producer, consumer = pair["producer"], pair["consumer"]
    c_before = metrics(consumer.url)
    done = subprocess.run(
        [sys.executable, "-m", "mmscope.load.command", "--encoder-url", producer.url,
         "--url", consumer.url, "--json", "--reuse", "0,0.5", "--requests", "6",
         "--image-size", "32x32", "--concurrency", "2", "--seed", "2626"],
        capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["ok"] is True and out["urls"] == [f"{producer.url} -> {consumer.url}"]
    assert [lv["planned_hits"] for lv in out["levels"]] == [0, 3]
    for level in out["levels"]:
        # The producer follows the plan as a single server does.
        assert level["verdict"]["status"] == "match"
        assert level["observed_queries"] == level["images"] == 6
        assert level["observed_hits"] == level["planned_hits"]
        assert level["observed_misses"] == level["distinct_images"]
        # The PD instance: no miss; each distinct image loaded once, the repeats resident.
        pd = level["pd_instance"]
        assert (pd["queries"], pd["misses"]) == (6, 0)
        assert pd["connector"] == level["distinct_images"]
        assert pd["local"] + pd["in_step"] == level["planned_hits"]
        assert "PD instance: all 6 queries hits" in level["verdict"]["text"]
    # The probe image and each level's distinct images, loaded once each.
    distinct = sum(lv["distinct_images"] for lv in out["levels"]) + 1
    c = settled(consumer.url, c_before, "ec_connector_transfer_items{direction=load}", distinct)
    assert transfers(c, "load")[0] == distinct


def dashboard() -> dict:
    with open(DASHBOARD) as f:
        return json.load(f)


def panel_exprs(title: str) -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] if p.get("title") == title
            for t in p["targets"]]


def test_every_row_repeats_per_instance_so_the_pair_is_never_summed():
    rows = [p for p in dashboard()["panels"] if p["type"] == "row"]
    assert rows and all(r.get("repeat") == "instance" for r in rows)
    assert dashboard()["panels"][0]["type"] == "row"  # no panel above the first repeated row


def test_transfer_panels_on_prometheus_scraping_both_instances(pair, tmp_path):
    """Grafana's row repeat fills $instance with one instance: each panel then reads that
    instance's transfers, equal to what the scripted sequence moved."""
    producer, consumer = pair["producer"], pair["consumer"]
    instances = {name: f"127.0.0.1:{pair[name].port}" for name in ("producer", "consumer")}
    probe = "vllm:ec_connector_transfer_items_total"

    def scraped_after(t: float) -> dict[str, float]:
        """Per instance, its first stored sample after t (the two are scraped out of phase)."""
        return {name: prom.wait_for_scrape_after(f'{probe}{{instance="{i}"}}', t)
                for name, i in instances.items()}

    with Prometheus(list(instances.values()), str(tmp_path)) as prom:
        start = scraped_after(time.time())
        before = metrics(consumer.url)
        for n, seed in enumerate([61, 62, 61]):
            route(pair, body(consumer.model, seed, f"Panel {n}?"))
        settled(consumer.url, before, "ec_connector_transfer_items{direction=load}", 2)
        time.sleep(1.5)  # one more update interval on both
        end = scraped_after(time.time())
        found = prom.query(f"count by (instance) ({probe})", max(end.values()))
        assert {s["metric"]["instance"] for s in found} == set(instances.values())

        files = list(pair["shared"].glob("*/*.safetensors"))
        image_bytes = stored_bytes(pair["shared"]) / len(files)  # images of one size: one shape
        moved = {"producer": "save", "consumer": "load"}
        for name, instance in instances.items():
            # exactly this instance's samples from start to end, as Grafana's range would be
            at = end[name] + 0.001
            window = f"{round((at - start[name] + 0.001) * 1000)}ms"

            def panel(title: str) -> dict[str, float]:
                expr = panel_exprs(title)[0]
                for var, value in (("job", ".*"), ("model_name", re.escape(pair[name].model)),
                                   ("instance", re.escape(instance)), ("engine", ".*")):
                    expr = expr.replace(f"${var}", value.replace("\\", "\\\\"))
                expr = expr.replace("$__rate_interval", window)
                return {s["metric"]["direction"]: float(s["value"][1])
                        for s in prom.query(expr, at)}

            seconds = end[name] - start[name]
            other = ({"save", "load"} - {moved[name]}).pop()
            items = {d: v * seconds for d, v in panel("EC transfer items / s").items()}
            assert items == pytest.approx({moved[name]: 2, other: 0}, rel=2e-3), name
            moved_bytes = panel("EC transfer bytes / s")[moved[name]] * seconds
            assert moved_bytes == pytest.approx(2 * image_bytes, rel=2e-3), name
            per_item = panel("EC transfer seconds per item")
            assert set(per_item) == {moved[name]} and per_item[moved[name]] > 0, name
