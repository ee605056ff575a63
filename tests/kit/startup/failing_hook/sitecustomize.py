"""Makes the encoder-cache ledger's allocation record raise, in every process that imports this.

Put on a vLLM server's PYTHONPATH by tests/engine/test_failing_hook.py: only the scheduler's
allocation hook calls `EncoderCacheLedger.allocated`, so that hook meets an error of its own.
"""
from mmscope.carry.ledger import EncoderCacheLedger

MESSAGE = "allocation record broken on purpose by tests/kit/startup/failing_hook"


def _raise(self, key):
    raise RuntimeError(MESSAGE)


# Fails at import when the method is renamed: the test then finds no warning and says so.
assert callable(EncoderCacheLedger.allocated)
EncoderCacheLedger.allocated = _raise
