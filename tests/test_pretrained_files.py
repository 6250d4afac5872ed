"""Pretrained checkpoints that are not what their config says, or not readable at all, as a user may hold them (a
save_pretrained folder, a GGUF file, a Hub model in the Hugging Face cache): each is refused in one line naming
model.pretrained and what is wrong, never converted with weights transformers made up; and loading stays quiet."""

import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf")

import torch  # noqa: E402
from checkpoint_files import (  # noqa: E402
    O_PROJ,
    add_extra,
    drop_o_proj,
    folder_checkpoint,
    gguf_checkpoint,
    hub_checkpoint,
    narrow_o_proj,
)
from sweep_helpers import command_in_process, one_line  # noqa: E402

from headcount.cli import ablate as ablating  # noqa: E402
from headcount.errors import ConfigError  # noqa: E402
from headcount.pretrained import load_pretrained  # noqa: E402
from headcount.pretrained.tiny_random import tiny_random_llama  # noqa: E402


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache that offline loads read (conftest sets HF_HUB_OFFLINE)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def checkpoint(kind: str, tmp_path, cache, edit=None) -> str:
    if kind == "folder":
        return str(folder_checkpoint(tmp_path / "model", edit))
    if kind == "gguf":
        return str(gguf_checkpoint(tmp_path / "model.gguf", edit))
    return hub_checkpoint(cache, "headcount-tests/tiny-llama", edit)


KINDS = ["folder", "gguf", "hub"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_whole_checkpoint_of_each_kind_loads_as_the_model_it_holds(kind, tmp_path, hub_cache):
    model = load_pretrained(checkpoint(kind, tmp_path, hub_cache)).model
    reference = load_pretrained(str(tiny_random_llama())).model
    ids = torch.tensor([list(b"heads attend")])
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference(ids), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "edit, words",
    [
        (drop_o_proj, f"lacks 1 tensor the model needs: {O_PROJ}"),
        (add_extra, "holds 1 tensor the model has no place for: "),
    ],
    ids=["missing", "unexpected"],
)
@pytest.mark.parametrize("kind", KINDS)
def test_a_tensor_missing_or_extra_is_refused_naming_it(kind, edit, words, tmp_path, hub_cache):
    """transformers fills a missing tensor with random values (a warning a quiet command hides) and drops an extra
    one: the converted model would not be the checkpoint."""
    source = checkpoint(kind, tmp_path, hub_cache, edit)
    with pytest.raises(ConfigError, match="model.pretrained=") as err:
        load_pretrained(source)
    assert words in str(err.value) and "\n" not in str(err.value), err.value
    if edit is add_extra:  # by the name the file gives it
        assert str(err.value).endswith(".1.self_attn.extra.weight (not a checkpoint of the model its config describes)")


def test_a_tensor_of_another_shape_is_refused_naming_it_and_both_shapes(tmp_path):
    source = str(folder_checkpoint(tmp_path / "model", narrow_o_proj))
    with pytest.raises(ConfigError) as err:
        load_pretrained(source)
    message = str(err.value)
    assert message.startswith(f"model.pretrained={source!r}: model.safetensors: ") and "\n" not in message
    assert f"{O_PROJ} has shape (64, 32), the config needs (64, 64)" in message, message


def no_weights(folder):
    (folder / "model.safetensors").unlink()


def garbage(folder):
    (folder / "model.safetensors").write_bytes(b"not a checkpoint " * 64)


def truncated(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def bad_header(folder):
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[8:20] = b"{" * 12
    (folder / "model.safetensors").write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, words",
    [
        (no_weights, "has no weights file (model.safetensors"),
        (garbage, "model.safetensors is damaged or not a safetensors file (header too large)"),
        (truncated, "model.safetensors is damaged or not a safetensors file (incomplete metadata"),
        (bad_header, "model.safetensors is damaged or not a safetensors file (invalid JSON in header"),
    ],
    ids=["no weights", "garbage", "truncated", "bad header"],
)
def test_a_folder_without_readable_weights_is_one_line_naming_the_file(damage, words, tmp_path):
    folder = folder_checkpoint(tmp_path / "model")
    damage(folder)
    with pytest.raises(ConfigError) as err:
        load_pretrained(str(folder))
    message = str(err.value)
    assert message.startswith(f"model.pretrained={str(folder)!r}: ") and words in message, message
    assert "\n" not in message


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_gguf_file_is_one_line(damage, tmp_path):
    path = gguf_checkpoint(tmp_path / "model.gguf")
    data = path.read_bytes()
    path.write_bytes(data[:5000] if damage == "truncated" else b"garbage")
    with pytest.raises(ConfigError, match=r"model.pretrained=.*model.gguf.*is damaged or not a GGUF file") as err:
        load_pretrained(str(path))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("edit, words", [(drop_o_proj, O_PROJ), (truncated, "damaged or not a safetensors file")])
def test_the_commands_refuse_such_a_folder_in_one_line_and_leave_nothing(edit, words, tmp_path, monkeypatch, capsys):
    if edit is truncated:
        folder = folder_checkpoint(tmp_path / "model")
        truncated(folder)
    else:
        folder = folder_checkpoint(tmp_path / "model", edit)
    (tmp_path / "work").mkdir()
    args = [f"model.pretrained={folder}", "data.n_train=64", "data.n_val=16", "data.n_test=16", "ablation=baseline"]
    assert command_in_process(ablating.main, monkeypatch, tmp_path / "work", args) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("error: model.pretrained=") and words in line, line
    assert not list((tmp_path / "work").iterdir())


def test_loading_is_quiet_unless_asked(tmp_path, capfd, monkeypatch):
    """transformers draws a bar reading the weights (and headcount another de-quantising a GGUF file); the commands
    hide them, and so does the Python API unless verbose=True."""
    import transformers

    # As in a fresh Python session: no quiet command ran before in this process
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    transformers.utils.logging.enable_progress_bar()
    source = str(gguf_checkpoint(tmp_path / "model.gguf"))
    capfd.readouterr()
    load_pretrained(source)
    quiet = capfd.readouterr()
    assert quiet.err == "" and quiet.out == ""
    load_pretrained(source)  # from the converted-weights cache: quiet too
    assert capfd.readouterr() == ("", "")
    monkeypatch.setenv("HEADCOUNT_CACHE", str(tmp_path / "another-cache"))  # converted again, with its bar
    load_pretrained(source, verbose=True)
    assert "de-quantizing" in capfd.readouterr().err
