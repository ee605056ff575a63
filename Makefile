# The two entry points of the README: `make demo` and `make test`. Both set up .venv first.
.PHONY: setup demo test bench

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/mmscope demo

# The whole suite on vLLM's V1 model runner, then the engine tests marked `runners` on V2.
test: setup
	.venv/bin/python -m pytest -q
	MMSCOPE_TEST_RUNNER=v2 .venv/bin/python -m pytest -q -m runners tests/engine

bench: setup
	.venv/bin/python bench/trace_overhead.py
