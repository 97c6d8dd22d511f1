"""The snapshot: the latest rendered block of every source, joined on scrape.

Sources publish a Batch when a collection ends; it is rendered to text right then, in the source's
thread. A scrape only joins the latest blocks (and compresses them when asked), with the result cached
until something changes.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable

from .catalog import SOURCES_ORDER
from .exposition import OPENMETRICS, TEXT, Batch, Renderer, join


class _Block:
    __slots__ = ("batch", "om", "renderer", "text")

    def __init__(self, batch: Batch, renderer: Renderer) -> None:
        self.batch = batch
        self.renderer = renderer
        self.text = renderer.render(batch, TEXT)
        self.om: bytes | None = None  # OpenMetrics is rarely asked for: rendered on demand

    def body(self, fmt: str) -> bytes:
        if fmt == TEXT:
            return self.text
        if self.om is None:
            self.om = self.renderer.render(self.batch, OPENMETRICS)
        return self.om


class Store:
    def __init__(self, extra: Callable[[str], bytes] | None = None, extra_ttl: float = 1.0) -> None:
        """`extra(fmt)` renders series outside the catalog (process metrics), refreshed every `extra_ttl`."""
        self._lock = threading.Lock()
        self._blocks: dict[str, _Block] = {}
        self._renderers: dict[str, Renderer] = {}
        self._version = 0
        self._extra = extra
        self._extra_ttl = extra_ttl
        self._extra_cache: dict[str, tuple[float, bytes]] = {}
        self._cache: dict[tuple[str, bool], tuple[int, float, bytes]] = {}

    def publish(self, source: str, batch: Batch | None) -> None:
        """Replace the source's series; None withdraws them."""
        block = None
        if batch is not None:
            renderer = self._renderers.setdefault(source, Renderer())
            block = _Block(batch, renderer)
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

    def exposition(self, fmt: str = TEXT, compress: bool = False) -> bytes:
        now = time.monotonic()
        with self._lock:
            extra_at, extra = self._extra_body(fmt, now)
            key = (fmt, compress)
            cached = self._cache.get(key)
            if cached is not None and cached[0] == self._version and cached[1] == extra_at:
                return cached[2]
            version = self._version
            blocks = sorted(self._blocks.items(), key=lambda kv: _source_rank(kv[0]))
        body = join([b.body(fmt) for _, b in blocks] + [extra], fmt)
        if compress:
            body = gzip.compress(body, compresslevel=1, mtime=0)
        with self._lock:
            self._cache[key] = (version, extra_at, body)
        return body


def _source_rank(name: str) -> tuple[int, str]:
    return (SOURCES_ORDER.index(name) if name in SOURCES_ORDER else len(SOURCES_ORDER), name)
