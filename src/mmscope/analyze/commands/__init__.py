"""`mmscope analyze` and `mmscope compare`, and the analysis cache that answers a repeated run.
"""
