"""Open an SQLite file for reading through DuckDB's SQLite scanner, leaving the file as found.

In place and read-only, except a WAL file without its `-shm`: SQLite would create that (and a
`-wal`) even to read it, so such a file is read from a private copy.
"""
from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile

from mmscope.errors import UserError

WAL_SUFFIX, SHM_SUFFIX = "-wal", "-shm"
HEADER_BYTES = 100
# Header bytes 18 and 19 are the read and write format versions: 2 in WAL mode, 1 otherwise.
WAL_FORMAT = 2


def companions(path: str) -> list[str]:
    """The files beside a database that its contents depend on (the `-wal`), where present."""
    wal = path + WAL_SUFFIX
    return [wal] if os.path.exists(wal) else []


def in_wal_mode(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    return len(head) >= 20 and head[18] == WAL_FORMAT


def needs_copy(path: str) -> bool:
    """A WAL database without a `-shm`: reading in place would create it and a `-wal`."""
    return in_wal_mode(path) and not os.path.exists(path + SHM_SUFFIX)


@contextlib.contextmanager
def readable(path: str):
    """A path that reads as `path` does now, without writing beside `path`."""
    if not needs_copy(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="mmscope-read-") as tmp:
        copy = os.path.join(tmp, os.path.basename(path))
        shutil.copyfile(path, copy)
        if os.path.exists(path + WAL_SUFFIX):
            shutil.copyfile(path + WAL_SUFFIX, copy + WAL_SUFFIX)
        yield copy


def extension_path() -> str:
    """DuckDB's SQLite scanner as the duckdb-extension-sqlite-scanner wheel ships it."""
    import duckdb
    import duckdb_extension_sqlite_scanner as ext

    root = os.path.join(os.path.dirname(ext.__file__), "extensions")
    found = sorted(glob.glob(os.path.join(root, f"v{duckdb.__version__}", "*.duckdb_extension"))
                   + glob.glob(os.path.join(root, f"v{duckdb.__version__}", "*",
                                            "*.duckdb_extension")))
    if not found:
        raise UserError(f"DuckDB {duckdb.__version__} has no SQLite scanner in {root} "
                        "(install duckdb-extension-sqlite-scanner of the same version)")
    return found[0]


def connect(path: str, threads: int | None = None):
    """A DuckDB connection with `path` attached read-only as the catalog `db`."""
    from mmscope.analyze.ranges import sql

    # Rows come back in the scan's (rowid) order, which the reader's second query relies on.
    con = sql.connect(threads, preserve_insertion_order=True)
    con.execute(f"LOAD '{_quoted(extension_path())}'")
    con.execute(f"ATTACH '{_quoted(path)}' AS db (TYPE sqlite, READ_ONLY)")
    return con


def _quoted(text: str) -> str:
    return text.replace("'", "''")
