# The two entry points of the README: `make demo` and `make test`. Both set up .venv first.
.PHONY: setup demo test bench

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/mmscope demo

test: setup
	.venv/bin/python -m pytest -q

bench: setup
	.venv/bin/python bench/trace_overhead.py
