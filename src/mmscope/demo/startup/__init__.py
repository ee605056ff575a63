"""Folder put first on PYTHONPATH for servers of mmscope's tiny models (see mmscope.demo.environment).

Its sitecustomize.py runs at the start-up of every Python process there."""
