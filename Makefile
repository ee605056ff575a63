# The two entry points of the README: `make demo` and `make test`. Both set up .venv first; the
# tests also .venv-vllm034, vLLM 0.34's own code for tests/vllm034.
.PHONY: setup setup-tests demo test bench screenshot

setup:
	@bash scripts/setup.sh

setup-tests:
	@bash scripts/setup.sh --tests

demo: setup
	.venv/bin/mmscope demo

# The suites of tests/README.md, in the order they need more: pure Python and the external tools
# (no engine), the engine tests on vLLM's V1 model runner, those marked `runners` again on V2,
# and last vLLM 0.34's real code in its own environment (.venv-vllm034). Two pytest-xdist
# workers, each test module whole on one (its shared engine or server). Tests without an engine
# run apart from the engine tests: they apply and revert hooks in their own process, which an
# in-process engine there would then miss (vLLM loads the plugin once per process). The V2 run
# is one long module and a few short ones: no faster on two workers.
test: setup-tests
	.venv/bin/python -m pytest -q -n 2 --dist loadfile tests/unit tests/tools
	.venv/bin/python -m pytest -q -n 2 --dist loadfile tests/engine
	MMSCOPE_TEST_RUNNER=v2 .venv/bin/python -m pytest -q -m runners tests/engine
	.venv-vllm034/bin/python -m pytest -q tests/vllm034

bench: setup
	.venv/bin/python bench/trace_overhead.py

# The README's picture of the HTML report, from a fresh demo run.
screenshot: setup
	.venv/bin/python scripts/report_screenshot.py --out docs/report.png
