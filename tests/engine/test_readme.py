"""The README's marked blocks run as written (tests/kit/readme.py says how): the offline snippet as
a script, and the workflow where nsys cannot run: `mmscope record` around the real OpenAI server
(plugin installed), a load sweep, Ctrl-C while an answer is still generated, then `mmscope analyze`. The quick start runs in
test_encoder_cache_server.py, whose server it is."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import httpx
import pytest

from mmscope import stages
from mmscope.demo import environment
from tests.kit import readme
from tests.kit.server import chat

pytestmark = pytest.mark.vllm


def test_the_install_line_builds_and_installs_mmscope_from_a_clone(tiny_model, tmp_path):
    """`pip install .` in a clone (its tracked files as they are here), as written: pip builds the
    package, its C library too, and installs it with vLLM's plugin entry point. Into a virtual
    environment of its own, first on PATH, without dependencies: the suite's stays as it is."""
    clone = tmp_path / "mmscope"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=readme.ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        source = readme.ROOT / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    with readme.Section("install", tiny_model, clone, env={"PIP_NO_DEPS": "1"}) as section:
        section.env["PATH"] = os.pathsep.join([str(venv / "bin"), section.env["PATH"]])
        section.run_rest()
    site, = venv.glob("lib/python*/site-packages")
    assert list((site / "mmscope" / "record").glob("_nvtx_inject*.so"))
    entry_points, = site.glob("mmscope-*.dist-info/entry_points.txt")
    assert "mmscope.vllm.plugin:register" in entry_points.read_text()


def test_the_offline_snippet_runs_as_a_script(tiny_model, tmp_path):
    with readme.Section("offline", tiny_model, tmp_path) as section:
        (block, output), = section.run_rest()
    assert block.lang == "python" and "encoder_cache_hits_by_source" in output


def test_without_the_stand_ins_vllms_error_names_the_fix(tiny_model, tmp_path):
    """A new machine (vLLM's model-inspection cache empty) without a torchvision that loads and
    without mmscope's stand-ins on PYTHONPATH: vLLM cannot import LLaVA, and says how to fix it."""
    if environment.torchvision_loads():
        pytest.skip("torchvision loads here: vLLM imports LLaVA without the stand-ins")
    section = readme.Section("offline", tiny_model, tmp_path)
    env = dict(section.env, VLLM_CACHE_ROOT=str(tmp_path / "vllm-cache"),
               PYTHONPATH=os.pathsep.join(p for p in section.env["PYTHONPATH"].split(os.pathsep)
                                          if p != environment.STARTUP_DIR))
    code = section.substitute(section.pending[0].code)
    done = subprocess.run(["python", "-c", code], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    printed = done.stdout + done.stderr  # vLLM logs to stdout
    assert done.returncode != 0
    assert "No module named 'torchvision'" in printed
    assert f"mmscope: this model file needs torchvision, which does not load here; start vLLM " \
           f"with PYTHONPATH={environment.STARTUP_DIR}" in printed


def test_record_the_server_send_a_sweep_stop_it_then_analyze(tiny_model, tmp_path):
    def a_long_answer_still_running():
        """A user stops the server while an answer is still generated: the recording's last
        step is cut, which is no failed check."""
        url = f"http://127.0.0.1:{section.port}"
        threading.Thread(target=_quietly, args=(chat, url, section.server.model, [], "Long?", 900),
                         daemon=True).start()
        time.sleep(1.5)

    with readme.Section("record", tiny_model, tmp_path) as section:
        section.serve()
        outputs = section.run_rest(before_stop=a_long_answer_still_running)
    analyzed = outputs[-1][1]
    assert stages.VIT_FORWARD in analyzed and stages.hash_range("image_bytes") in analyzed

    done = subprocess.run(["mmscope", "analyze", "run.sqlite", "--json"], env=section.env,
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    count = {s["name"]: s["count"] for s in report["stages"]}
    # The sweep's 8 images and its probe image, sent as data URLs: one hash each on that branch
    # (vLLM's warm-up hashes PIL images).
    assert count[stages.hash_range("image_bytes")] == 9
    # The encoder ran, and not for the sweep's repeats: fewer encoder batches than images.
    assert 1 <= count[stages.VIT_FORWARD] < 9
    for name in (stages.PREPROCESS, stages.FORWARD, stages.GATHER_MM_EMBEDDINGS,
                 stages.EMBED_INPUT_IDS, stages.processor_range("apply_hf_processor")):
        assert count.get(name, 0) >= 1, name
    assert all(c["ok"] for c in report["checks"]), report["checks"]


def _quietly(call, *args):
    try:
        call(*args)
    except httpx.HTTPError:  # the server stopped under it: what the test wants
        pass
