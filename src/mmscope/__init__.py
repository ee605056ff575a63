"""mmscope: make the multimodal pipeline of LLM serving visible.

The core (stages, tracing, accounting, analysis, record, load) knows nothing about vLLM; `mmscope.vllm` is the adapter.
"""
__version__ = "0.1.0"
