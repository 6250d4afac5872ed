"""The data layer: every source's layout and targets, determinism, text caching, bad input, the DataModule."""

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from headcount.config import CONF_DIR
from headcount.config.data import SYNTHETIC_SOURCES
from headcount.data import (
    SOURCES,
    DataConfig,
    HeadcountDataModule,
    build_splits,
    data_vocab_size,
    induction_first_part_mask,
)
from headcount.data.cache import cache_root
from headcount.data.synthetic import induction_segment_range
from headcount.data.text import stdlib_files, stdlib_split_of
from headcount.errors import ConfigError

SPLITS = ("train", "val", "test")
SMALL = {"n_train": 48, "n_val": 16, "n_test": 16, "batch_size": 8}


def synthetic_cfg(source: str, tmp_path: Path, **overrides) -> DataConfig:
    return DataConfig(source=source, cache_dir=str(tmp_path), **{**SMALL, **overrides})


def columns(split) -> dict[str, torch.Tensor]:
    return split[:]  # the whole split as (n, seq_len) tensors


def arrays(split) -> tuple[np.ndarray, np.ndarray]:
    return columns(split)["input_ids"].numpy(), columns(split)["loss_mask"].numpy()


def as_bytes(split) -> list[bytes]:
    return [bytes(row.tolist()) for row in columns(split)["input_ids"]]


# --- synthetic tasks -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", SYNTHETIC_SOURCES)
def test_synthetic_shapes_dtypes_and_vocab(source, tmp_path):
    cfg = synthetic_cfg(source, tmp_path)
    splits = build_splits(cfg)
    assert set(splits) == set(SPLITS)
    for split, n in zip(SPLITS, (cfg.n_train, cfg.n_val, cfg.n_test)):
        rows = columns(splits[split])  # a sequence-to-sequence task's src_ids and src_mask too
        ids, mask = rows["input_ids"], rows["loss_mask"]
        assert ids.dtype == torch.int64 and mask.dtype == torch.bool
        assert ids.shape == mask.shape == (n, cfg.seq_len)
        assert not mask[:, 0].any() and mask.any(dim=1).all()
        assert 0 <= ids.min() and ids.max() < data_vocab_size(cfg)


def check_induction(ids, mask, cfg):
    shortest, longest = induction_segment_range(cfg.seq_len)
    first_part = induction_first_part_mask(torch.as_tensor(mask)).numpy()
    lengths = set()
    for row, row_mask, row_first in zip(ids, mask, first_part):
        length = int(row_first.sum())
        lengths.add(length)
        assert shortest <= length <= longest
        expected = np.zeros(cfg.seq_len, dtype=bool)
        expected[length + 2 : 2 * length + 1] = True
        assert (row_mask == expected).all()
        assert (np.flatnonzero(row_first) == np.arange(1, length + 1)).all()
        targets = np.flatnonzero(expected)
        assert (row[targets] == row[targets - length]).all()
    assert (ids[:, 1:] >= 1).all()  # 0 is BOS only
    if longest > shortest:
        assert len(lengths) > 1  # the repeat offset varies, so no fixed-offset head can solve the task


def check_assoc_recall(ids, mask, cfg):
    half, pairs = cfg.vocab_size // 2, cfg.n_pairs
    for row, row_mask in zip(ids, mask):
        keys, values = row[1 : 2 * pairs : 2], row[2 : 2 * pairs + 1 : 2]
        assert len(set(keys)) == pairs and (1 <= keys).all() and (keys < half).all() and (values >= half).all()
        stored = dict(zip(keys, values))
        answers = np.flatnonzero(row_mask)
        assert len(answers) == pairs and answers.min() > 2 * pairs
        assert sorted(row[answers - 1]) == sorted(keys)  # every key is queried once
        assert all(row[p] == stored[row[p - 1]] for p in answers)


def check_offset_diff(ids, mask, cfg):
    a, b = cfg.offset_a, cfg.offset_b
    targets = np.flatnonzero(mask[0])
    assert (mask == mask[0]).all() and len(targets) == cfg.seq_len // 2 - max(a, b)
    t = (targets - 1) // 2
    assert (targets % 2 == 1).all() and t.min() == max(a, b)
    assert (ids[:, targets] == (ids[:, 2 * (t - a)] - ids[:, 2 * (t - b)]) % cfg.vocab_size).all()


def check_copy(ids, mask, cfg):
    length = (cfg.seq_len - 2) // 2
    assert (ids[:, 0] == 0).all() and (ids[:, length + 1] == 1).all() and (ids[:, 1 : length + 1] >= 2).all()
    targets = np.flatnonzero(mask[0])
    assert (mask == mask[0]).all() and (targets == np.arange(length + 2, 2 * length + 2)).all()
    assert (ids[:, targets] == ids[:, 1 : length + 1]).all()


CHECKS = {
    "induction": check_induction,
    "assoc_recall": check_assoc_recall,
    "offset_diff": check_offset_diff,
    "copy": check_copy,
}


@pytest.mark.parametrize(
    "source, overrides",
    [
        ("induction", {}),
        ("induction", {"seq_len": 9, "vocab_size": 5}),  # odd seq_len: no padding
        ("assoc_recall", {}),
        ("assoc_recall", {"n_pairs": 3, "seq_len": 13, "vocab_size": 8}),  # tight fit on both limits
        ("offset_diff", {}),
        ("offset_diff", {"offset_a": 4, "offset_b": 2, "seq_len": 15, "vocab_size": 7}),
        ("copy", {}),
        ("copy", {"seq_len": 7, "vocab_size": 3}),
    ],
)
def test_synthetic_targets_follow_the_task(source, overrides, tmp_path):
    cfg = synthetic_cfg(source, tmp_path, **overrides)
    for split in build_splits(cfg).values():
        CHECKS[source](*arrays(split), cfg)


@pytest.mark.parametrize("source", SYNTHETIC_SOURCES)
def test_synthetic_is_deterministic_and_seed_and_split_dependent(source, tmp_path):
    cfg = synthetic_cfg(source, tmp_path)
    first, again = build_splits(cfg), build_splits(cfg)
    reseeded = build_splits(dataclasses.replace(cfg, seed=1))
    for split in SPLITS:
        assert all(np.array_equal(x, y) for x, y in zip(arrays(first[split]), arrays(again[split])))
        assert not np.array_equal(arrays(first[split])[0], arrays(reseeded[split])[0])
    train, val, test = (arrays(first[split])[0] for split in SPLITS)
    assert not np.array_equal(train[: cfg.n_val], val) and not np.array_equal(val, test)


@pytest.mark.parametrize(
    "source, overrides, key",
    [
        ("nonsense", {}, "data.source"),
        ("induction", {"seq_len": 1}, "data.seq_len"),
        ("induction", {"seq_len": 4}, "data.seq_len"),
        ("induction", {"n_val": 0}, "data.n_val"),
        ("induction", {"seed": -1}, "data.seed"),
        ("induction", {"batch_size": 100}, "data.batch_size"),
        ("assoc_recall", {"n_pairs": 16, "vocab_size": 32, "seq_len": 80}, "data.n_pairs"),
        ("assoc_recall", {"n_pairs": 8, "seq_len": 32}, "data.seq_len"),
        ("offset_diff", {"offset_a": 2, "offset_b": 2}, "data.offset_b"),
        ("offset_diff", {"offset_a": 0}, "data.offset_a"),
        ("offset_diff", {"offset_b": 32, "seq_len": 64}, "data.offset_b"),
        ("copy", {"vocab_size": 2}, "data.vocab_size"),
        ("text", {"path": None}, "data.path"),
        ("text", {"path": "x.txt", "val_fraction": 0.0}, "data.val_fraction"),
        ("text", {"path": "x.txt", "val_fraction": 0.5, "test_fraction": 0.5}, "data.test_fraction"),
        ("hub", {"hub_name": None}, "data.hub_name"),
        ("pystdlib", {"cache_dir": "relative/cache"}, "data.cache_dir"),
    ],
)
def test_bad_config_names_the_key(source, overrides, key, tmp_path):
    cfg = dataclasses.replace(synthetic_cfg("induction", tmp_path), source=source, **overrides)
    with pytest.raises(ConfigError, match=re.escape(key)):
        build_splits(cfg)


def test_data_vocab_size(tmp_path):
    assert data_vocab_size(synthetic_cfg("copy", tmp_path, vocab_size=17)) == 17
    assert data_vocab_size(DataConfig(source="pystdlib", vocab_size=17)) == 256
    with pytest.raises(ConfigError, match="data.source"):
        data_vocab_size(DataConfig(source="wikipedia"))


# --- text files ------------------------------------------------------------------------------------------------------


def corpus(tag: str, lines: int = 400) -> bytes:
    """Distinct lines (so every chunk is unique), non-ASCII UTF-8 and CRLF endings that must survive byte for byte."""
    return "".join(f"{tag} line {i}: naïve café ☕\r\n" for i in range(lines)).encode()


def text_cfg(path: Path, tmp_path: Path, **overrides) -> DataConfig:
    fields = {"seq_len": 32, "n_train": 10_000, "n_val": 10_000, "n_test": 10_000, "val_fraction": 0.1}
    return DataConfig(source="text", path=str(path), cache_dir=str(tmp_path / "cache"), **{**fields, **overrides})


def chunks_of(data: bytes, seq_len: int) -> list[bytes]:
    return [data[i : i + seq_len] for i in range(0, len(data) - seq_len + 1, seq_len)]


def test_text_file_round_trips_bytes_into_disjoint_splits(tmp_path):
    data = corpus("a")
    (tmp_path / "a.txt").write_bytes(data)
    cfg = text_cfg(tmp_path / "a.txt", tmp_path)
    splits = build_splits(cfg)
    rows = {split: as_bytes(splits[split]) for split in SPLITS}
    assert sorted(sum(rows.values(), [])) == sorted(chunks_of(data, cfg.seq_len))  # every chunk, once
    n_chunks = len(chunks_of(data, cfg.seq_len))
    assert (len(rows["val"]), len(rows["test"])) == (np.ceil(0.1 * n_chunks), np.ceil(0.05 * n_chunks))
    mask = columns(splits["train"])["loss_mask"]
    assert not mask[:, 0].any() and mask[:, 1:].all()
    capped = build_splits(dataclasses.replace(cfg, n_train=5, n_val=2, n_test=1))
    assert [len(capped[split]) for split in SPLITS] == [5, 2, 1]


def test_text_folder_reads_every_txt_file_in_sorted_order(tmp_path):
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "b.txt").write_bytes(corpus("b", 100))
    (folder / "a.txt").write_bytes(corpus("a", 100))
    (folder / "notes.md").write_bytes(corpus("md", 100))
    cfg = text_cfg(folder, tmp_path)
    rows = sum((as_bytes(split) for split in build_splits(cfg).values()), [])
    assert sorted(rows) == sorted(chunks_of(corpus("a", 100) + corpus("b", 100), cfg.seq_len))


def test_text_cache_is_reused_and_follows_content_and_seed(tmp_path, monkeypatch):
    path = tmp_path / "a.txt"
    path.write_bytes(corpus("a"))
    cfg = text_cfg(path, tmp_path)
    first = as_bytes(build_splits(cfg)["train"])
    assert len(list((tmp_path / "cache").glob("text-*"))) == 1

    def no_reading(*args, **kwargs):
        raise AssertionError("the cache should have been used")

    with monkeypatch.context() as patch:
        patch.setattr("headcount.data.text._load_documents", no_reading)
        assert as_bytes(build_splits(cfg)["train"]) == first

    reseeded = as_bytes(build_splits(dataclasses.replace(cfg, seed=1))["train"])
    assert sorted(reseeded) != sorted(first)  # a different set of chunks, not just a different order
    path.write_bytes(corpus("changed"))
    changed = as_bytes(build_splits(cfg)["train"])
    assert all(row in corpus("changed") for row in changed) and set(changed).isdisjoint(first)
    assert len(list((tmp_path / "cache").glob("text-*"))) == 3


def test_text_build_that_fails_leaves_no_cache_behind(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_bytes(corpus("a"))

    def crash(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr("headcount.data.text.split_by_fraction", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        build_splits(text_cfg(tmp_path / "a.txt", tmp_path))
    assert list((tmp_path / "cache").iterdir()) == []


def missing_file(tmp: Path) -> Path:
    return tmp / "missing.txt"


def folder_without_txt(tmp: Path) -> Path:
    (tmp / "docs").mkdir()
    (tmp / "docs" / "readme.md").write_text("not a .txt file")
    return tmp / "docs"


def empty_file(tmp: Path) -> Path:
    (tmp / "empty.txt").write_bytes(b"")
    return tmp / "empty.txt"


def short_file(tmp: Path) -> Path:
    (tmp / "short.txt").write_bytes(b"x" * 70)  # two 32-byte chunks: one split goes without
    return tmp / "short.txt"


@pytest.mark.parametrize(
    "make_path, message",
    [
        (missing_file, "no such file or folder"),
        (folder_without_txt, "no .txt files"),
        (empty_file, "empty"),
        (short_file, "too little text"),
    ],
)
def test_text_bad_path_names_data_path(make_path, message, tmp_path):
    path = make_path(tmp_path)
    with pytest.raises(ConfigError, match=rf"data\.path={re.escape(repr(str(path)))}.*{message}"):
        build_splits(text_cfg(path, tmp_path))


def test_cache_dir_default_resolves_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path))
    assert cache_root(DataConfig()) == tmp_path
    assert cache_root(DataConfig(cache_dir="~/somewhere")) == Path.home() / "somewhere"


# --- Python standard library -----------------------------------------------------------------------------------------

PYSTDLIB = {"source": "pystdlib", "seq_len": 64, "n_train": 64, "n_val": 16, "n_test": 16, "batch_size": 8}


@pytest.fixture(scope="module")
def pystdlib(tmp_path_factory):
    cfg = DataConfig(**PYSTDLIB, cache_dir=str(tmp_path_factory.mktemp("pystdlib")))
    return cfg, build_splits(cfg)


def test_pystdlib_builds_capped_byte_chunks(pystdlib):
    cfg, splits = pystdlib
    for split, n in zip(SPLITS, (cfg.n_train, cfg.n_val, cfg.n_test)):
        ids = columns(splits[split])["input_ids"]
        assert ids.shape == (n, cfg.seq_len) and ids.max() < 256


def test_pystdlib_is_deterministic(pystdlib, tmp_path):
    cfg, splits = pystdlib
    again = build_splits(dataclasses.replace(cfg, cache_dir=str(tmp_path)))
    assert all(torch.equal(columns(splits[split])["input_ids"], columns(again[split])["input_ids"]) for split in SPLITS)


def test_pystdlib_splits_by_file(pystdlib):
    cfg, splits = pystdlib
    root, files = stdlib_files()
    assert not any(part in ("test", "tests", "idlelib", "site-packages") for f in files for part in f.split("/")[:-1])
    by_split = {split: [f for f in files if stdlib_split_of(f, cfg) == split] for split in SPLITS}
    assert all(by_split.values()) and sum(map(len, by_split.values())) == len(files)  # disjoint, covering, non-empty
    for split in SPLITS:
        text = b"".join((root / f).read_bytes() for f in by_split[split])
        offsets = [text.find(row) for row in as_bytes(splits[split])]
        assert min(offsets) >= 0  # every chunk comes from its own split's files
        if split == "train":
            assert max(offsets) > len(text) // 2  # the cap samples across the files, not just the first ones


# --- DataModule ------------------------------------------------------------------------------------------------------


def test_datamodule_batches(tmp_path):
    cfg = synthetic_cfg("induction", tmp_path, n_train=20, n_val=12)
    data = HeadcountDataModule(cfg)
    assert data.vocab_size == cfg.vocab_size
    with pytest.raises(RuntimeError, match="setup"):
        data.splits  # noqa: B018
    data.setup()
    splits = data.splits
    data.setup("fit")
    assert data.splits is splits  # setup is idempotent
    train = list(data.train_dataloader())
    assert len(train) == 2  # 20 examples, batches of 8, last partial batch dropped
    assert [len(b["input_ids"]) for b in data.val_dataloader()] == [8, 4]  # evaluation keeps every example
    batch = train[0]
    assert set(batch) == {"input_ids", "loss_mask"}
    assert batch["input_ids"].dtype == torch.int64 and batch["loss_mask"].dtype == torch.bool
    assert batch["input_ids"].shape == batch["loss_mask"].shape == (cfg.batch_size, cfg.seq_len)


def test_datamodule_same_seed_same_batches(tmp_path):
    def first_batch(seed: int) -> torch.Tensor:
        data = HeadcountDataModule(synthetic_cfg("copy", tmp_path, seed=seed))
        data.setup()
        return next(iter(data.train_dataloader()))["input_ids"]

    assert torch.equal(first_batch(0), first_batch(0))
    assert not torch.equal(first_batch(0), first_batch(1))


# --- conf/data -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
def test_conf_data_file_is_valid(source, tmp_path):
    merged = OmegaConf.merge(
        OmegaConf.structured(DataConfig), OmegaConf.load(Path(CONF_DIR) / "data" / f"{source}.yaml")
    )
    cfg: DataConfig = OmegaConf.to_object(merged)
    assert cfg.source == source
    if source in SYNTHETIC_SOURCES:
        build_splits(dataclasses.replace(cfg, **SMALL))
