"""Integer columns of an Arrow C stream (what ADBC's driver hands over) copied batch by batch into
numpy arrays, through the Arrow C data interface: each batch lives only while it is copied, and
the driver steps SQLite while Python's lock is free (ctypes calls release it).
"""
from __future__ import annotations

import ctypes

import numpy as np

INT64_FORMAT = b"l"


class ArrowSchema(ctypes.Structure):
    pass


ArrowSchema._fields_ = [
    ("format", ctypes.c_char_p), ("name", ctypes.c_char_p), ("metadata", ctypes.c_char_p),
    ("flags", ctypes.c_int64), ("n_children", ctypes.c_int64),
    ("children", ctypes.POINTER(ctypes.POINTER(ArrowSchema))),
    ("dictionary", ctypes.POINTER(ArrowSchema)),
    ("release", ctypes.CFUNCTYPE(None, ctypes.POINTER(ArrowSchema))),
    ("private_data", ctypes.c_void_p)]


class ArrowArray(ctypes.Structure):
    pass


ArrowArray._fields_ = [
    ("length", ctypes.c_int64), ("null_count", ctypes.c_int64), ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64), ("n_children", ctypes.c_int64),
    ("buffers", ctypes.POINTER(ctypes.c_void_p)),
    ("children", ctypes.POINTER(ctypes.POINTER(ArrowArray))),
    ("dictionary", ctypes.POINTER(ArrowArray)),
    ("release", ctypes.CFUNCTYPE(None, ctypes.POINTER(ArrowArray))),
    ("private_data", ctypes.c_void_p)]


class ArrowArrayStream(ctypes.Structure):
    pass


ArrowArrayStream._fields_ = [
    ("get_schema", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ArrowArrayStream),
                                    ctypes.POINTER(ArrowSchema))),
    ("get_next", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ArrowArrayStream),
                                  ctypes.POINTER(ArrowArray))),
    ("get_last_error", ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.POINTER(ArrowArrayStream))),
    ("release", ctypes.CFUNCTYPE(None, ctypes.POINTER(ArrowArrayStream))),
    ("private_data", ctypes.c_void_p)]

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class StreamError(Exception):
    """The driver's stream failed (its message), or a column is not of 64-bit integers."""


def _stream(handle) -> ArrowArrayStream:
    capsule = handle.__arrow_c_stream__()
    address = _capsule_pointer(capsule, b"arrow_array_stream")
    stream = ArrowArrayStream.from_address(address)
    return stream, capsule


def _check(stream, code: int) -> None:
    if code:
        message = stream.get_last_error(ctypes.byref(stream))
        raise StreamError((message or b"error %d" % code).decode("utf-8", "replace"))


def read_into(handle, columns: list[np.ndarray], nulls: list[int], at: int) -> int:
    """The stream's batches copied into `columns` (one per stream column, int64 or narrower)
    from row `at`, NULLs as `nulls`; the rows copied. The arrays must have room."""
    stream, capsule = _stream(handle)
    try:
        schema = ArrowSchema()
        _check(stream, stream.get_schema(ctypes.byref(stream), ctypes.byref(schema)))
        try:
            if schema.n_children != len(columns):
                raise StreamError(f"{schema.n_children} columns, not {len(columns)}")
            for k in range(schema.n_children):
                child = schema.children[k].contents
                if child.format != INT64_FORMAT:
                    raise StreamError(f"column {child.name.decode()} holds "
                                      f"{child.format.decode()}, not integers")
        finally:
            schema.release(ctypes.byref(schema))
        start = at
        while True:
            batch = ArrowArray()
            _check(stream, stream.get_next(ctypes.byref(stream), ctypes.byref(batch)))
            if not batch.release:
                return at - start
            try:
                n = batch.length
                for k, (out, null) in enumerate(zip(columns, nulls)):
                    _copy(batch.children[k].contents, out[at:at + n], null)
                at += n
            finally:
                batch.release(ctypes.byref(batch))
    finally:
        if stream.release:
            stream.release(ctypes.byref(stream))
            stream.release = type(stream.release)()  # released: the capsule must not again
        del capsule


def _copy(child: ArrowArray, out: np.ndarray, null: int) -> None:
    n, offset = child.length, child.offset
    if n == 0:
        return
    data = np.ctypeslib.as_array(ctypes.cast(child.buffers[1], ctypes.POINTER(ctypes.c_int64)),
                                 shape=(offset + n,))[offset:]
    out[:] = data
    if child.null_count:
        bits = np.ctypeslib.as_array(ctypes.cast(child.buffers[0],
                                                 ctypes.POINTER(ctypes.c_uint8)),
                                     shape=((offset + n + 7) // 8,))
        valid = np.unpackbits(bits, bitorder="little")[offset:offset + n].view(bool)
        out[~valid] = null
