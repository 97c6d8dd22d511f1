"""The snapshot: the latest rendered block of every source, joined on scrape.

Sources publish a Batch when a collection ends; it is rendered to text right then, in the source's
thread. A scrape only joins the latest blocks (and compresses them when asked), with the result cached
until something changes.

Compression is per block, too: each block is deflated once, into raw deflate blocks that end on a byte
boundary and are not the last (what pigz does), so that a gzip body is the blocks' segments joined between
a gzip header and trailer: one ordinary gzip member, whatever the client. A scrape after a change then
compresses the blocks that changed, not the whole body; and a source's next block is compressed as it is
published, in the source's thread, when a scrape asked for the one it replaces compressed (a scraper as
frequent as the source), so that such scrapes only join.
"""

from __future__ import annotations

import struct
import threading
import time
import zlib
from collections.abc import Callable, Sequence

from .exposition import OPENMETRICS, TEXT, Batch, Renderer

GZIP_LEVEL = 1
# gzip member header: deflate, no flags, mtime 0, "fastest" compression, OS unknown (RFC 1952)
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\xff"
_LAST_BLOCK = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS).flush()  # an empty final block
_EOF = b"# EOF\n"


def deflate_segment(data: bytes) -> bytes:
    """`data` as raw deflate blocks, byte-aligned and not final, that refer to nothing before them: segments
    joined, then an empty final block, are one deflate stream."""
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)


def gzip_segments(parts: Sequence[bytes], segments: Sequence[bytes]) -> bytes:
    """One gzip member of `parts` joined, from their `deflate_segment`s."""
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    size = sum(len(part) for part in parts)
    return b"".join([_GZIP_HEADER, *segments, _LAST_BLOCK, struct.pack("<II", crc, size & 0xFFFFFFFF)])


_EOF_SEGMENT = deflate_segment(_EOF)


class _Block:
    __slots__ = ("batch", "deflated", "om", "renderer", "served", "text")

    def __init__(self, batch: Batch, renderer: Renderer) -> None:
        self.batch = batch
        self.renderer = renderer
        self.text = renderer.render(batch, TEXT)
        self.om: bytes | None = None  # OpenMetrics is rarely asked for: rendered on demand
        self.deflated: dict[str, bytes] = {}  # format -> deflate_segment of its body
        self.served: set[str] = set()  # formats a scrape asked for compressed

    def body(self, fmt: str) -> bytes:
        if fmt == TEXT:
            return self.text
        if self.om is None:
            self.om = self.renderer.render(self.batch, OPENMETRICS)
        return self.om

    def deflate(self, fmt: str) -> bytes:
        segment = self.deflated.get(fmt)
        if segment is None:
            segment = self.deflated[fmt] = deflate_segment(self.body(fmt))
        return segment


class Store:
    def __init__(self, extra: Callable[[str], bytes] | None = None, extra_ttl: float = 1.0,
                 order: Sequence[str] = (), refresh: Callable[[], None] | None = None) -> None:
        """`extra(fmt)` renders series outside the catalog (process metrics), refreshed every `extra_ttl`;
        `order`, the sources' names in the order their blocks are joined (others follow, by name); `refresh`, called
        before each exposition (to publish what is only worth building when someone reads it)."""
        self._refresh = refresh
        self._rank = {name: i for i, name in enumerate(order)}
        self._lock = threading.Lock()
        self._blocks: dict[str, _Block] = {}
        self._renderers: dict[str, Renderer] = {}
        self._version = 0
        self._extra = extra
        self._extra_ttl = extra_ttl
        self._extra_cache: dict[str, tuple[float, bytes]] = {}
        self._extra_deflated: dict[str, tuple[float, bytes]] = {}
        self._cache: dict[tuple[str, bool], tuple[int, float, bytes]] = {}

    def publish(self, source: str, batch: Batch | None) -> None:
        """Replace the source's series; None withdraws them."""
        block = None
        if batch is not None:
            renderer = self._renderers.setdefault(source, Renderer())
            block = _Block(batch, renderer)
            previous = self._blocks.get(source)
            for fmt in tuple(previous.served) if previous is not None else ():
                block.deflate(fmt)  # scraped compressed since the last one: it will be again, compress it now
        with self._lock:
            if block is None:
                if self._blocks.pop(source, None) is None:
                    return
            else:
                self._blocks[source] = block
            self._version += 1

    def batch(self, source: str) -> Batch | None:
        block = self._blocks.get(source)
        return block.batch if block else None

    def _extra_body(self, fmt: str, now: float) -> tuple[float, bytes]:
        if self._extra is None:
            return 0.0, b""
        cached = self._extra_cache.get(fmt)
        if cached is None or now - cached[0] >= self._extra_ttl:
            cached = (now, self._extra(fmt))
            self._extra_cache[fmt] = cached
        return cached

    def _extra_segment(self, fmt: str, extra_at: float, extra: bytes) -> bytes:
        cached = self._extra_deflated.get(fmt)
        if cached is None or cached[0] != extra_at:
            cached = self._extra_deflated[fmt] = (extra_at, deflate_segment(extra))
        return cached[1]

    def exposition(self, fmt: str = TEXT, compress: bool = False) -> bytes:
        if self._refresh is not None:
            self._refresh()
        now = time.monotonic()
        with self._lock:
            extra_at, extra = self._extra_body(fmt, now)
            key = (fmt, compress)
            cached = self._cache.get(key)
            if cached is not None and cached[0] == self._version and cached[1] == extra_at:
                return cached[2]
            version = self._version
            blocks = [block for _, block in
                      sorted(self._blocks.items(), key=lambda kv: (self._rank.get(kv[0], len(self._rank)), kv[0]))]
            extra_segment = self._extra_segment(fmt, extra_at, extra) if compress else b""
        parts = [block.body(fmt) for block in blocks] + [extra]
        if fmt == OPENMETRICS:
            parts.append(_EOF)
        if compress:
            segments = []
            for block in blocks:
                block.served.add(fmt)
                segments.append(block.deflate(fmt))
            segments.append(extra_segment)
            if fmt == OPENMETRICS:
                segments.append(_EOF_SEGMENT)
            body = gzip_segments(parts, segments)
        else:
            body = b"".join(parts)
        with self._lock:
            self._cache[key] = (version, extra_at, body)
        return body
