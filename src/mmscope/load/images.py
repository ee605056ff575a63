"""The workload's images, synthetic noise: each level a canvas of its own, and each image that
canvas with a last row of its own, as PNG (or JPEG) files and as data URLs.

A level's PNG is deflated (stored blocks: noise gains nothing from compression or PNG's row
filters), checksummed and base64-encoded once; an image adds one row's worth of work: zlib's stream
state copied and finished on its row, the checksums carried on from the canvas's. Encoding each
file whole would cost ten times the noise's own making (Pillow tries every filter on every row).
"""
from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np

# Mixed into every pixel seed so our images never coincide with other numpy-seeded images.
PIXEL_DOMAIN = 0x6D6D6C64  # "mmld"
IMAGE_FORMATS = {"png": "image/png", "jpeg": "image/jpeg"}  # --media-format -> content type
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_RGB8 = (8, 2, 0, 0, 0)  # bit depth 8, colour type RGB, deflate, filter method 0, no interlace


def noise(seed: list[int], size: int) -> np.ndarray:
    """`size` random bytes: the generator's raw words, a quarter of the cost of drawing bytes."""
    words = np.random.default_rng(seed).bit_generator.random_raw(-(-size // 8))
    return words.view(np.uint8)[:size]


def chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(data, zlib.crc32(kind))
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


PNG_END = chunk(b"IEND", b"")


class Canvas:
    """A level's images in one size and format, each made once."""

    def __init__(self, seed: int, level: int, size: tuple[int, int], fmt: str):
        width, height = size
        self.seed, self.level, self.fmt = seed, level, fmt
        self.row = 1 + 3 * width  # a PNG row: its filter byte (0, none), then its pixels
        self.rows = noise([PIXEL_DOMAIN, seed, level], height * self.row).reshape(height, self.row)
        self.rows[:, 0] = 0
        self.files: dict[int, bytes] = {}
        self.urls: dict[int, tuple[bytes, ...]] = {}  # each image's own pieces of its data URL
        self.shared: tuple[bytes, ...] = ()  # the pieces every image's data URL begins with
        self.prefix = f'"data:{IMAGE_FORMATS[fmt]};base64,'.encode()
        if fmt == "png":
            self._deflate_the_canvas(width, height)

    def last_row(self, image: int) -> np.ndarray:
        row = noise([PIXEL_DOMAIN, self.seed, self.level, image], self.row)
        row[0] = 0
        return row

    def file(self, image: int) -> bytes:
        if image not in self.files:
            self.files[image] = (self.head + self._png_tail(image) if self.fmt == "png"
                                 else self._jpeg(image))
        return self.files[image]

    def data_url(self, image: int) -> tuple[bytes, ...]:
        """As the pieces of a JSON string (client.Url): a PNG's head is the canvas's, in base64
        once, only its tail the image's own (so a level's URLs take little memory); request
        bodies splice them in (base64 needs no escapes)."""
        if image not in self.urls:
            self.urls[image] = (
                (base64.b64encode(self.head_rest + self._png_tail(image)) + b'"',)
                if self.fmt == "png" else (base64.b64encode(self.file(image)) + b'"',))
        return (self.prefix, *self.shared, *self.urls[image])

    def _deflate_the_canvas(self, width: int, height: int) -> None:
        """Everything up to the last row, once: the file's head (its image data's length known
        from the first image's, stored blocks being as long as what they store), the image data's
        checksum so far, and the head in base64 up to its last whole 3 bytes."""
        self.deflate = zlib.compressobj(0, zlib.DEFLATED, 9, 1)  # stored blocks: a small state
        body = self.deflate.compress(self.rows[:-1])
        length = len(body) + len(self._stream_end(self.rows[-1]))
        self.head = (PNG_SIGNATURE + chunk(b"IHDR", struct.pack(">II5B", width, height, *PNG_RGB8))
                     + struct.pack(">I", length) + b"IDAT" + body)
        self.crc = zlib.crc32(body, zlib.crc32(b"IDAT"))
        whole = len(self.head) - len(self.head) % 3
        self.shared, self.head_rest = (base64.b64encode(self.head[:whole]),), self.head[whole:]

    def _stream_end(self, row: np.ndarray) -> bytes:
        deflate = self.deflate.copy()
        return deflate.compress(row) + deflate.flush()

    def _png_tail(self, image: int) -> bytes:
        end = self._stream_end(self.last_row(image))
        return end + struct.pack(">I", zlib.crc32(end, self.crc)) + PNG_END

    def _jpeg(self, image: int) -> bytes:
        from PIL import Image

        rows = self.rows.copy()
        rows[-1] = self.last_row(image)
        buf = io.BytesIO()
        pixels = rows[:, 1:].reshape(rows.shape[0], -1, 3)
        Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
        return buf.getvalue()
