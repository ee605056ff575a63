"""The range table and what is computed on it: nesting, the stage tree, per-stage figures, device
time, the step join, the checks, the cache benefit and the per-step view.
"""
