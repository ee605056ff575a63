"""Encoder-cache sizing from an access log: the hit rate the encoder cache would have at every
capacity (a miss-ratio curve under vLLM 0.32's eviction rule) and the capacity a target needs.

`trace.load` reads the log, `model.curve` computes the curve in one pass, `replay` is the
per-capacity reference simulation it is checked against, `command` is `mmscope cache-size`.
"""
