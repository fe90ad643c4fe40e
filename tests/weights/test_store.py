"""The model cache folder, its per-entry lock and file hashes."""

import hashlib
import threading
import time
from pathlib import Path

from loosespec.weights import store


def test_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOSESPEC_CACHE", str(tmp_path / "c"))
    assert store.cache_root() == tmp_path / "c"
    monkeypatch.delenv("LOOSESPEC_CACHE")
    assert store.cache_root() == Path.home() / ".cache" / "loosespec"


def test_sha256_file_is_the_hash_of_the_bytes_on_disk(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"x" * (5 << 20))  # more than one read
    assert store.sha256_file(f) == hashlib.sha256(f.read_bytes()).hexdigest()


def test_locked_makes_a_second_holder_wait_and_say_so(tmp_path, capsys):
    lock = tmp_path / "sub" / store.LOCK
    order, inside = [], threading.Event()

    def first():
        with store.locked(lock, "thing"):
            inside.set()
            time.sleep(0.3)
            order.append("first")

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(10)
    with store.locked(lock, "thing"):
        order.append("second")
    t.join(10)
    assert order == ["first", "second"] and lock.exists()
    assert "another process is preparing thing" in capsys.readouterr().err


def test_remove_files_deletes_all_but_the_lock_and_counts_the_bytes(tmp_path):
    folder = tmp_path / "m"
    (folder / "hf" / "sub").mkdir(parents=True)
    (folder / "model.gguf").write_bytes(b"g" * 1000)
    (folder / "hf" / "model.safetensors").write_bytes(b"s" * 300)
    (folder / "hf" / "sub" / "x.json").write_bytes(b"{}")
    (folder / store.LOCK).write_bytes(b"")
    assert store.remove_files(folder) == 1302
    assert [p.name for p in folder.iterdir()] == [store.LOCK], "the lock file is kept: a waiter may hold it"
    assert store.remove_files(folder) == 0 and store.remove_files(tmp_path / "nothing") == 0
