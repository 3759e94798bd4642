"""Limits that stricter, earlier checks used to shadow, reached with inputs that pass every earlier
check: the total unpacked size of nested archives of ordinary text at the default limits, and
``file_read`` windows over a large plain-text extract, which never load the whole extract."""

from __future__ import annotations

import threading
import time

import psutil
import pytest

from errors import FileParseError
from memory.files import FileStore
from runtime.files import FileReader, ParseService
from runtime.parsing import ParseLimits, parse_document
from tests import hostile_files as H
from tests.files_support import LONG

MiB = 1024 * 1024


def test_nested_archives_of_ordinary_text_reach_the_default_total_unpacked_size():
    limits = ParseLimits()  # the defaults: 200 MiB in all, 64 MiB a member, 200:1 a member
    member = H.text_member(14 * MiB)  # ordinary log lines: about 20:1, under the ratio
    inner = H._zip(
        [(f"part{i}.txt", member) for i in range(4)], level=6
    )  # 56 MiB unpacked, each level alone under the total
    data = H._zip([(f"inner{k}.zip", inner) for k in range(4)], level=0)  # 4 x 56 MiB: 224 MiB across the levels
    assert max(len(member), len(inner)) < limits.max_part_bytes and len(member) < limits.max_ratio * len(inner) / 4
    with pytest.raises(FileParseError) as info:
        parse_document(data, name="logs.zip", limits=limits)
    assert info.value.reason == "too_large"
    assert "nested archives included" in str(info.value) and f"{limits.max_unpacked_bytes:,}" in str(info.value)
    one = H._zip([("inner0.zip", inner)], level=0)  # one inner archive alone passes every limit
    assert parse_document(one, name="logs.zip", limits=limits).has_text


def _rss() -> int:
    return psutil.Process().memory_info().rss


def test_windows_over_a_40_mb_text_extract_are_read_without_loading_it_whole(store):
    files = FileStore(store.engine)
    text = H.text_member(40 * MiB)
    stored = files.add(user_id="u1", name="server.log", data=text)
    with ParseService(files) as parses:
        assert parses.wait(stored.id, LONG * 4) == "ready"
    pages = files.get(stored.id, user_id="u1").page_count
    assert pages > 1000
    reader = FileReader(files, None)
    first = reader.file_read(stored.id, "u1", start_page=1, max_pages=1)
    assert "line 0-00000000 of an ordinary log file" in first
    before = _rss()
    peak = [before]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.005)

    results: list[str] = []

    def read(k: int) -> None:
        for page in range(1 + k * 97, pages, pages // 5):  # windows spread over the whole extract
            results.append(reader.file_read(stored.id, "u1", start_page=page, max_pages=1))

    sampler = threading.Thread(target=sample)
    sampler.start()
    readers = [threading.Thread(target=read, args=(k,)) for k in range(8)]
    for r in readers:
        r.start()
    for r in readers:
        r.join(LONG * 4)
    stop.set()
    sampler.join()
    assert len(results) >= 8 * 5 and all("of an ordinary log file" in r for r in results)
    # eight concurrent readers of a 40 MiB extract: had each loaded it whole (as text, and its copy
    # from the driver) the process would have grown by hundreds of MiB
    assert peak[0] - before < 64 * MiB, f"grew by {(peak[0] - before) / MiB:.0f} MiB"
    # a sanity bound on the whole worker process, which also holds the models and caches of the tests
    # that ran in it before this one: what it measures is the growth above
    assert peak[0] < 3072 * MiB
