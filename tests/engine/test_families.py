"""Each tiny model family on the real in-process engine: exact encoder-cache counters per
modality, in items and in embeddings, for scripted image, video and audio sequences, the
`mm:hash:<branch>` ranges those items take, and `vit_forward` only in the steps that ran the
encoder."""
from __future__ import annotations

import gc
import time

import pytest

from mmscope import stages
from mmscope.demo import inputs, tiny_model
from mmscope.emit import tracing
from tests.kit import otlp, traces as tk
from tests.kit.engine import EncoderWork, counters, offline_llm
from tests.kit.server import chat_parts, metrics, video_data_url

pytestmark = pytest.mark.vllm

MODALITIES = {"llava": ("image",), "qwen2_5_vl": ("image", "video"), "qwen2_audio": ("audio",)}
# The MultiModalHasher branch each family's items take, as the offline prompts give them.
HASH_BRANCH = {"image": "pil_image", "video": "ndarray", "audio": "ndarray"}
SEEDS = {"image": 300, "video": 400, "audio": 500}
MODEL_CLASSES = {
    "llava": "vllm.model_executor.models.llava:LlavaForConditionalGeneration",
    "qwen2_5_vl": "vllm.model_executor.models.qwen2_5_vl:Qwen2_5_VLForConditionalGeneration",
    "qwen2_audio": "vllm.model_executor.models.qwen2_audio:Qwen2AudioForConditionalGeneration"}


def built(tmp_path_factory, arch: str) -> str:
    """One directory per family for the test run (the build is idempotent)."""
    return tiny_model.build(str(tmp_path_factory.getbasetemp() / f"tiny-{arch}"), arch=arch)


@pytest.fixture(scope="module", params=sorted(MODALITIES))
def family(request, tmp_path_factory):
    """One engine per family, tracing to its own folder, as a process started with
    MMSCOPE_TRACE=chrome and MMSCOPE_TRACE_DIR would."""
    from mmscope.vllm.instrumentor import get_instrumentor

    arch = request.param
    model = built(tmp_path_factory, arch)
    trace_dir = tmp_path_factory.mktemp(f"traces-{arch}")
    env = pytest.MonkeyPatch()
    env.setenv("MMSCOPE_TRACE", "chrome")
    env.setenv("MMSCOPE_TRACE_DIR", str(trace_dir))
    tracing.configure()
    get_instrumentor().uninstrument()  # the ranges' hooks are chosen with tracing on, as at
    get_instrumentor().instrument()  # the start of a process
    work = EncoderWork(MODEL_CLASSES[arch])
    llm = offline_llm(model, limit_mm_per_prompt={m: 2 for m in MODALITIES[arch]},
                      enable_prefix_caching=False,  # every repeat is an encoder-cache query
                      allowed_local_media_path=str(tmp_path_factory.mktemp(f"media-{arch}")))
    work.reset()
    yield arch, tiny_model.family(arch), llm, trace_dir, work
    work.close()
    del llm
    gc.collect()
    env.undo()
    tracing.configure("off")
    get_instrumentor().uninstrument()
    get_instrumentor().instrument()


def generate(llm, prompts):
    from vllm import SamplingParams
    llm.generate(prompts, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True),
                 use_tqdm=False)


def ranges_since(trace_dir, t0_us):
    tracing.flush()
    ranges, _ = tk.load(trace_dir)
    return [r for r in ranges if r.start >= t0_us]


def now_us():
    return time.perf_counter_ns() / 1000


def delta(after, before):
    return {k: after[k] - before.get(k, 0) for k in after}


SCRIPT_EXPECTED = [  # queries, hits, misses, in-step hits, local hits, vit_forward ranges
    (2, 1, 1, 1, 0, 1),  # computed once, shared by the request beside it in the same step
    (1, 1, 0, 0, 1, 0),  # resident from the earlier request: no encoder step
    (0, 0, 0, 0, 0, 0),  # text only
    (2, 0, 2, 0, 0, 1),  # two new items, one encoder step
]


def run_script(fam, llm, trace_dir, work, modality):
    """The scripted calls for one modality; (counter deltas, ranges, embeddings the encoder
    computed) per generate call."""
    a, b, c = (SEEDS[modality] + i for i in range(3))
    by_call = []
    for prompts in (
            [fam.prompt([(modality, a)], "One?"), fam.prompt([(modality, a)], "The same, at once?")],
            [fam.prompt([(modality, a)], "Seen before?")],
            [fam.prompt([], "Just text")],
            [fam.prompt([(modality, b), (modality, c)], "Two new ones?")]):
        before, t0, rows = counters(llm), now_us(), work.rows
        generate(llm, prompts)
        by_call.append((delta(counters(llm), before), ranges_since(trace_dir, t0),
                        work.rows - rows))
    return by_call


@pytest.fixture(scope="module")
def scripted(family):
    """The family's engine and, per modality, (counter deltas, ranges, embeddings computed) per
    scripted call."""
    arch, fam, llm, trace_dir, work = family
    return arch, {m: run_script(fam, llm, trace_dir, work, m) for m in MODALITIES[arch]}


def test_counters_per_modality_exact(scripted):
    arch, runs = scripted
    for modality, calls in runs.items():
        queries = f"encoder_cache_queries_by_modality{{modality={modality}}}"
        hits = f"encoder_cache_hits_by_modality{{modality={modality}}}"
        for n, ((d, _, _), want) in enumerate(zip(calls, SCRIPT_EXPECTED)):
            got = (d[queries], d[hits], d["encoder_cache_misses"],
                   d["encoder_cache_hits_by_source{source=in_step}"],
                   d["encoder_cache_hits_by_source{source=local}"])
            assert got == want[:5], f"{arch} {modality}, call {n}"
            assert d["encoder_cache_queries"] == d[queries]  # no other modality counted


def test_embedding_counters_weigh_each_item_by_what_the_encoder_computes(scripted, family):
    """In embeddings: misses are exactly the rows the encoder computed; the repeats of item a hit
    its rows; the occupancy in bytes is what the worker's tensors take."""
    arch, runs = scripted
    work = family[4]
    for modality, calls in runs.items():
        (first, _, rows_a), (again, _, none), (_, _, _), (last, _, rows_bc) = calls
        label = f"{{modality={modality}}}"
        assert none == 0 and rows_a > 0 and rows_bc > 0, f"{arch} {modality}"
        want = [  # query, hit, miss embeds; in-step and local hit embeds
            (first, 2 * rows_a, rows_a, rows_a, rows_a, 0),
            (again, rows_a, rows_a, 0, 0, rows_a),
            (last, rows_bc, 0, rows_bc, 0, 0)]
        for d, query, hit, miss, in_step, local in want:
            assert (d["encoder_cache_query_embeds"], d[f"encoder_cache_query_embeds_by_modality{label}"],
                    d["encoder_cache_hit_embeds"], d[f"encoder_cache_hit_embeds_by_modality{label}"],
                    d["encoder_cache_miss_embeds"],
                    d["encoder_cache_hit_embeds_by_source{source=in_step}"],
                    d["encoder_cache_hit_embeds_by_source{source=local}"]) == (
                query, query, hit, hit, miss, in_step, local), f"{arch} {modality}"
    now = counters(family[2])
    per_embed = now["encoder_cache_capacity_bytes"] / now["encoder_cache_capacity_embeds"]
    assert work.nbytes == work.rows * per_embed
    assert now["encoder_cache_usage_bytes"] == now["encoder_cache_usage_embeds"] * per_embed


def test_vit_forward_only_in_the_steps_that_ran_the_encoder(scripted):
    arch, runs = scripted
    for modality, calls in runs.items():
        vit = [len(tk.named(rs, stages.VIT_FORWARD)) for _, rs, _ in calls]
        assert vit == [want[5] for want in SCRIPT_EXPECTED], f"{arch} {modality}"


def test_hash_range_per_item_named_by_its_branch(scripted):
    arch, runs = scripted
    for modality, calls in runs.items():
        hash_name = stages.hash_range(HASH_BRANCH[modality])
        for n, ((_, rs, _), want) in enumerate(zip(calls, SCRIPT_EXPECTED)):
            hashes = [r.name for r in rs if r.name.startswith(stages.HASH_PREFIX)]
            assert hashes == [hash_name] * want[0], f"{arch} {modality}, call {n}"


def test_vit_forward_nested_in_preprocess(family):
    arch, fam, llm, trace_dir, _ = family
    first = MODALITIES[arch][0]
    t0 = now_us()
    generate(llm, [fam.prompt([(first, 600)], "New?")])
    generate(llm, [fam.prompt([(first, 600)], "Again?")])
    rs = ranges_since(trace_dir, t0)
    vit = tk.named(rs, stages.VIT_FORWARD)
    preprocess = tk.named(rs, stages.PREPROCESS)
    assert len(vit) == 1 and len(preprocess) >= 2  # the second request's steps ran none
    assert tk.parent_of(vit[0], preprocess + vit) in preprocess


@pytest.mark.parametrize("family", ["qwen2_5_vl"], indirect=True)
def test_images_of_different_sizes_weigh_their_embeddings(family):
    """Qwen2.5-VL sizes an image's embeddings by its pixels: a wide image weighs twice a square
    one in the embedding counters, as in the encoder's own output."""
    from mmscope.demo import inputs

    arch, fam, llm, trace_dir, work = family
    square, wide = (810, (56, 56)), (811, (112, 56))

    def ask(images, text):
        data = [inputs.image(seed, size) for seed, size in images]
        return {"prompt": f"user: {fam.IMAGE_PART * len(images)}{text}\nassistant:",
                "multi_modal_data": {"image": data[0] if len(data) == 1 else data}}

    rows = []
    for images in ([square], [wide]):
        before = work.rows
        generate(llm, [ask(images, "Size?")])
        rows.append(work.rows - before)
    assert rows[1] == 2 * rows[0] > 0
    before = counters(llm)
    generate(llm, [ask([square, wide], "Both again?")])
    d = delta(counters(llm), before)
    assert (d["encoder_cache_queries"], d["encoder_cache_hits"]) == (2, 2)
    assert d["encoder_cache_query_embeds"] == d["encoder_cache_hit_embeds"] == sum(rows)
    assert d["encoder_cache_miss_embeds"] == 0


@pytest.mark.parametrize("family", ["qwen2_5_vl"], indirect=True)
def test_image_and_video_in_one_request(family):
    arch, fam, llm, trace_dir, _ = family
    before, t0 = counters(llm), now_us()
    generate(llm, [fam.prompt([("image", 700), ("video", 700)], "Both?"),
                   fam.prompt([("video", 700)], "The clip alone?")])
    d, rs = delta(counters(llm), before), ranges_since(trace_dir, t0)
    assert (d["encoder_cache_queries_by_modality{modality=image}"],
            d["encoder_cache_queries_by_modality{modality=video}"],
            d["encoder_cache_hits_by_modality{modality=video}"],
            d["encoder_cache_misses"]) == (1, 2, 1, 2)
    assert len(tk.named(rs, stages.VIT_FORWARD)) >= 1
    hashes = sorted(r.name for r in rs if r.name.startswith(stages.HASH_PREFIX))
    assert hashes == sorted([stages.hash_range("pil_image")]
                            + [stages.hash_range(HASH_BRANCH["video"])] * 2)


def wav(i: int) -> bytes:
    import io

    import soundfile

    samples, rate = inputs.audio(i)
    buf = io.BytesIO()
    soundfile.write(buf, samples, rate, format="WAV")
    return buf.getvalue()


def media_part(llm, modality: str, source: str, i: int) -> dict:
    """An OpenAI chat part: a data URL as clients send bytes inline, or a file URL under the
    engine's --allowed-local-media-path."""
    import base64
    import os

    if modality == "video":
        return {"type": "video_url", "video_url": {"url": video_data_url(i)}}
    if source == "data_url":
        return {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav(i)).decode(),
                                                       "format": "wav"}}
    path = os.path.join(llm.llm_engine.model_config.allowed_local_media_path, f"clip-{i}.wav")
    with open(path, "wb") as f:
        f.write(wav(i))
    return {"type": "audio_url", "audio_url": {"url": "file://" + path}}


@pytest.mark.parametrize("family,source", [("qwen2_5_vl", "data_url"), ("qwen2_audio", "data_url"),
                                           ("qwen2_audio", "file")], indirect=["family"])
def test_a_video_and_an_audio_by_url_have_their_fetch_and_decode_stages(family, source):
    """A chat's mp4 video and wav audio (data URLs; the audio as a file too, which vLLM's audio
    decoder reads itself), fetched and decoded by vLLM's media IO on this thread: each a fetch
    (the base64 decode, the file's path) then a decode range of its modality."""
    from vllm import SamplingParams

    arch, _, llm, trace_dir, _ = family
    modality = "video" if arch == "qwen2_5_vl" else "audio"
    t0 = now_us()
    llm.chat([{"role": "user", "content": [media_part(llm, modality, source, 900),
                                           {"type": "text", "text": "What is it?"}]}],
             SamplingParams(max_tokens=1), use_tqdm=False)
    rs = ranges_since(trace_dir, t0)
    fetch = tk.named(rs, stages.media_range("fetch", source, modality))
    decode = tk.named(rs, stages.media_range("decode", source, modality))
    assert len(fetch) == len(decode) == 1
    assert fetch[0].end <= decode[0].start


def test_a_server_counts_a_chat_video(tmp_path_factory, tmp_path, otlp_receiver):
    """The OpenAI server's processes (EngineCore is spawned) get the video processor through the
    start-up folder VllmServer puts on PYTHONPATH; an mp4 sent twice is one miss and one hit, in
    the counters and on vLLM's request spans, exported over OTLP."""
    from mmscope.demo.serve import VllmServer

    model = built(tmp_path_factory, "qwen2_5_vl")
    with VllmServer(model, str(tmp_path / "vllm.log"), extra_args=[
            "--limit-mm-per-prompt", '{"image": 2, "video": 2}',
            *otlp.server_args(otlp_receiver)], env=otlp.SERVER_ENV) as srv:
        clip = [{"type": "video_url", "video_url": {"url": video_data_url(800)}}]
        ids = [chat_parts(srv.url, model, clip, "What happens?")["id"],
               chat_parts(srv.url, model, clip, "And again?")["id"]]
        m = metrics(srv.url)
        spans = otlp_receiver.wait_for(lambda got: set(ids) <= set(otlp.request_spans(got)))
    assert (m["encoder_cache_queries_by_modality{modality=video}"],
            m["encoder_cache_hits_by_modality{modality=video}"], m["encoder_cache_misses"],
            m["encoder_cache_hits_by_source{source=local}"]) == (2, 1, 1, 1)
    first, again = (otlp.request_spans(spans)[i] for i in ids)
    facts = [otlp.multimodal(first), otlp.multimodal(again)]
    embeds = facts[0]["embeddings.computed"]
    assert embeds > 0
    assert [{k: v for k, v in f.items() if v} for f in facts] == [
        {"items.video": 1, "encoder_cache.misses": 1, "embeddings.computed": embeds},
        {"items.video": 1, "encoder_cache.hits.local": 1, "embeddings.spared": embeds}]
    assert "encoder" in otlp.parts(spans, first) and "encoder" not in otlp.parts(spans, again)
