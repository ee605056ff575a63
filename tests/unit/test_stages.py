"""The stage catalogue: names, aliases, step_meta round trip, parent structure."""
from hypothesis import given, strategies as st

from mmscope import stages


def test_seed_names_are_exact():
    assert stages.VIT_FORWARD == "gpu_model_runner: vit_forward"
    assert stages.EC_LOAD == "ec_connector: load"
    assert stages.EC_SAVE == "ec_connector: save"
    assert stages.GATHER_MM_EMBEDDINGS == "gpu_model_runner: gather_mm_embeddings"
    assert stages.PREPROCESS == "gpu_model_runner: preprocess"
    assert stages.hash_range("pil_image") == "mm:hash:pil_image"


def test_processor_stages_map_vllm_timing_names():
    assert stages.processor_range("get_cache_missing_items") == "mm:processor:cache_lookup"
    assert stages.processor_range("apply_hf_processor") == "mm:processor:hf_processor"
    assert stages.processor_range("apply_prompt_updates") == "mm:processor:prompt_update"
    assert stages.processor_range("something_new") == "mm:processor:something_new"


def test_preprocess_children_have_preprocess_parent():
    assert set(stages.PREPROCESS_SIBLINGS) == {
        stages.EC_LOAD, stages.VIT_FORWARD, stages.EC_SAVE, stages.GATHER_MM_EMBEDDINGS,
        stages.EMBED_INPUT_IDS, stages.PREPARE_MM_INPUTS}
    for name in stages.PREPROCESS_SIBLINGS:
        assert stages.PARENTS[name] == stages.PREPROCESS


def test_aliases_from_the_original_patch():
    assert stages.canonical("vit_forward") == stages.VIT_FORWARD
    assert stages.canonical("gather_mm_embeddings") == stages.GATHER_MM_EMBEDDINGS
    assert stages.canonical(stages.FORWARD) == stages.FORWARD


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 4096))
def test_step_meta_round_trip(prefill, decode, reqs):
    shape = stages.StepShape(prefill, decode, prefill + decode, reqs)
    name = stages.step_meta_range(shape)
    assert name == (f"step_meta: prefill={prefill} decode={decode} "
                    f"total={prefill + decode} reqs={reqs}")
    assert stages.parse_step_meta(name) == shape


def test_parse_step_meta_rejects_other_names():
    assert stages.parse_step_meta(stages.FORWARD) is None
    assert stages.parse_step_meta("step_meta: prefill=x") is None


@given(st.lists(st.tuples(st.integers(1, 512), st.integers(0, 2048), st.integers(1, 2048)),
                max_size=64))
def test_split_prefill_decode_matches_numpy(rows):
    import numpy as np

    from mmscope.emit.step_shape import split_prefill_decode

    sched, comp, prom = (np.array([r[i] for r in rows], dtype=np.int32) for i in range(3))
    shape = split_prefill_decode(sched, comp, prom)
    prefill = int(sched[comp < prom].sum())
    assert shape == stages.StepShape(prefill, int(sched.sum()) - prefill, int(sched.sum()), len(rows))


def test_timed_stages_are_every_stage_the_stage_timer_names():
    timed = set(stages.TIMED_STAGES)
    assert len(timed) == len(stages.TIMED_STAGES)  # no name twice
    assert {stages.hash_range(b) for b in stages.HASH_BRANCHES + ("mixed",)} <= timed
    assert {stages.processor_range(s) for s in stages.PROCESSOR_STAGES} <= timed
    assert set(stages.PREPROCESS_SIBLINGS) <= timed
    assert stages.PREPROCESS not in timed and stages.FORWARD not in timed  # vLLM's, not timed
