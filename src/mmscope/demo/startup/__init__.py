"""Folder put first on PYTHONPATH for servers of mmscope's tiny models (mmscope.demo.environment).

Its sitecustomize.py runs at the start-up of every Python process there."""
