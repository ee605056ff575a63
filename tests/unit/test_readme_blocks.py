"""The README's marked blocks (tests/kit/readme.py): every section runs in the engine suite, CI runs
the README's first commands, and the rules by which the blocks are read, changed and checked."""
from __future__ import annotations

from pathlib import Path

from tests.kit import readme

ENGINE_TESTS = Path(__file__).resolve().parents[1] / "engine"


def test_every_marked_section_is_run_by_an_engine_test():
    sections = {b.section for b in readme.blocks() if b.kind != "ci"}
    assert {"quick-start", "offline", "record"} <= sections
    sources = "".join(p.read_text() for p in ENGINE_TESTS.glob("test_*.py"))
    assert {s for s in sections if f'Section("{s}"' not in sources} == set()


def test_each_section_starts_at_most_one_server_before_what_needs_it_stopped():
    by_section: dict[str, list[str]] = {}
    for block in readme.blocks():
        by_section.setdefault(block.section, []).append(block.kind)
        assert block.lang in ("bash", "python"), block
    for kinds in by_section.values():
        assert kinds.count("serve") <= 1
        if "stopped" in kinds:
            assert kinds.index("serve") < kinds.index("stopped")


def test_ci_runs_the_readmes_first_commands():
    ci_block, = [b for b in readme.blocks() if b.kind == "ci"]
    ci = (readme.ROOT / ".ci" / "run").read_text().splitlines()
    commands = [line.split("#")[0].strip() for line in ci_block.code.splitlines()]
    for command in filter(None, commands):
        assert any(line.split("#")[0].rstrip().endswith(command) for line in ci), command
    assert any("VLLM_CACHE_ROOT=" in line and "XDG_CACHE_HOME=" in line
               and line.endswith("make demo") for line in ci)


def test_a_block_is_its_code_then_the_output_it_shows():
    text = ("intro\n<!-- readme-test: s run -->\n```python\nprint(1)\n# not output\nx = 2\n"
            "# 1\n# ...\n```\nmore\n```bash\nunmarked\n```\n")
    block, = readme.blocks(text)
    assert (block.section, block.kind, block.lang, block.line) == ("s", "run", "python", 3)
    assert block.code == "print(1)\n# not output\nx = 2\n"
    assert block.shows == ["1", "..."]


def test_shown_output_matches_in_order_with_dots_for_anything():
    output = "noise\n{'a': 1.0, 'b': [2]} \nlast line\n"
    assert readme.shows(["{'a': 1.0, ...}", "last line"], output)
    assert not readme.shows(["last line", "{'a': 1.0, ...}"], output)
    assert not readme.shows(["{'a': 2.0, ...}"], output)
    assert readme.shows([], "")


def test_hub_models_folder_and_port_become_this_machines():
    section = readme.Section.__new__(readme.Section)
    section.model, section.workdir, section.port = "/m/tiny", Path("/w"), 43210
    text = ('serve --model Qwen/Qwen2.5-VL-3B-Instruct --port 8000; curl localhost:8000/x; '
            'LLM(model="llava-hf/llava-1.5-7b-hf"); mmscope tiny-model /tmp/tiny-llava; '
            'url http://127.0.0.1:8000; --requests 80000')
    assert section.substitute(text) == (
        'serve --model /m/tiny --port 43210; curl localhost:43210/x; LLM(model="/m/tiny"); '
        'mmscope tiny-model /w/tiny-llava; url http://127.0.0.1:43210; --requests 80000')
