"""The analysis of a profile and its renderings: the figures computed once, then shown as terminal
tables, JSON, CSV or one self-contained HTML file.
"""
