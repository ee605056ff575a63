"""`mmscope load`: verify the encoder cache under sweep load against a live OpenAI server.

plan (seeded workload) -> client (streamed requests) -> sweep (/metrics deltas) -> verdict, report
"""
