"""exporter.core.allocator on this machine's C library: glibc takes the daemon's malloc settings, and the trimming
thread runs and stops."""

from __future__ import annotations

import platform
import threading

import pytest

from exporter.core import allocator


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc's")
def test_glibc_takes_the_settings_and_the_trim_thread_stops() -> None:
    assert allocator.tune() is True
    stop = threading.Event()
    thread = allocator.trim_every(0.01, stop)
    assert thread is not None and thread.is_alive()
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
