"""The profile readers, one per format: nsys SQLite exports and recordings (with their CUDA trace),
Chrome and torch profiler traces, and a vLLM /metrics page; each yields the range table.
"""
