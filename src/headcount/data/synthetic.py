"""Synthetic tasks, each solvable by a known attention mechanism, generated deterministically from the seed.

Token layouts (T = seq_len, V = vocab_size, positions 0-based; padding is token 0 with loss_mask False):
- induction:    BOS=0, s_1..s_L, s_1..s_L, r_1..r_R; s_i and r_i uniform in [1, V); the segment length L varies per
                example, uniform in [L_max // 2, L_max] with L_max = (T - 1) // 2, and random tokens fill the rest.
                Targets: positions L+2..2L, the repeated tokens whose previous token occurred before. Because L varies,
                no head can solve it by looking back a fixed distance: the model has to find the previous occurrence
                of the current token and copy what followed (an induction head). The first repeat (position L+1)
                follows a token seen only once, so it is not a target.
- assoc_recall: BOS=0, k_1 v_1 .. k_n v_n, then the same pairs in a random order, [pad]; n = n_pairs distinct keys
                in [1, V // 2), values uniform in [V // 2, V). Targets: the values of the second (query) part.
- offset_diff:  x_0 y_0 x_1 y_1 ...; x_t uniform in [0, V), y_t = (x[t - a] - x[t - b]) mod V with a, b = offset_a,
                offset_b, and y_t = 0 where t < max(a, b). Targets: y_t for t >= max(a, b), at positions 2t + 1.
- copy:         BOS=0, s_1..s_L, SEP=1, s_1..s_L, [pad]; s_i uniform in [2, V), L = (T - 2) // 2.
                Targets: the whole copy (SEP tells the model where the copy starts, so even its first token is known).
"""

import numpy as np
import torch

from headcount.config.data import DataConfig
from headcount.data.sources import DATA_SOURCES, SyntheticSource, synthetic_sources
from headcount.errors import ConfigError

BOS, SEP = 0, 1
Arrays = tuple[np.ndarray, np.ndarray]  # input_ids (n, T) int64, loss_mask (n, T) bool


def _empty(n: int, seq_len: int) -> Arrays:
    return np.full((n, seq_len), BOS, dtype=np.int64), np.zeros((n, seq_len), dtype=bool)


def _require(condition: bool, key: str, value: object, allowed: str) -> None:
    if not condition:
        raise ConfigError(key, value, allowed)


def induction_segment_range(seq_len: int) -> tuple[int, int]:
    """The smallest and largest segment length L of an induction example."""
    longest = (seq_len - 1) // 2
    return max(2, longest // 2), longest


def induction_first_part_mask(loss_mask_BT: torch.Tensor) -> torch.Tensor:
    """The first segment's positions 1..L of each induction example, (B, T) bool: unpredictable targets, the baseline
    that the repeated part's loss (the loss_mask, which starts at L + 2) is compared with."""
    length_B1 = loss_mask_BT.int().argmax(dim=1, keepdim=True) - 2
    pos_1T = torch.arange(loss_mask_BT.shape[1], device=loss_mask_BT.device)[None]
    return (pos_1T >= 1) & (pos_1T <= length_B1)


def _check_induction(cfg: DataConfig) -> None:
    _require(cfg.seq_len >= 5, "data.seq_len", cfg.seq_len, "induction needs at least 5 (BOS and two repeated tokens)")
    _require(cfg.vocab_size >= 2, "data.vocab_size", cfg.vocab_size, "induction needs at least 2 (BOS and a token)")


def _make_induction(rng: np.random.Generator, n: int, cfg: DataConfig) -> Arrays:
    ids, mask = _empty(n, cfg.seq_len)
    shortest, longest = induction_segment_range(cfg.seq_len)
    lengths = rng.integers(shortest, longest + 1, size=n)
    ids[:, 1:] = rng.integers(1, cfg.vocab_size, size=(n, cfg.seq_len - 1))
    for row, length in enumerate(lengths):
        ids[row, length + 1 : 2 * length + 1] = ids[row, 1 : length + 1]
        mask[row, length + 2 : 2 * length + 1] = True
    return ids, mask


def _check_assoc_recall(cfg: DataConfig) -> None:
    _require(cfg.n_pairs >= 1, "data.n_pairs", cfg.n_pairs, "must be a positive integer")
    n_keys = cfg.vocab_size // 2 - 1
    _require(
        cfg.n_pairs <= n_keys,
        "data.n_pairs",
        cfg.n_pairs,
        f"at most vocab_size // 2 - 1 = {n_keys} distinct keys fit in vocab_size={cfg.vocab_size}",
    )
    needed = 1 + 4 * cfg.n_pairs
    _require(
        cfg.seq_len >= needed, "data.seq_len", cfg.seq_len, f"assoc_recall with {cfg.n_pairs} pairs needs >= {needed}"
    )


def _make_assoc_recall(rng: np.random.Generator, n: int, cfg: DataConfig) -> Arrays:
    ids, mask = _empty(n, cfg.seq_len)
    pairs, first_value = cfg.n_pairs, cfg.vocab_size // 2
    # argsort of uniform noise = an independent random permutation per row, vectorised.
    keys = np.argsort(rng.random((n, first_value - 1)), axis=1)[:, :pairs] + 1
    values = rng.integers(first_value, cfg.vocab_size, size=(n, pairs))
    order = np.argsort(rng.random((n, pairs)), axis=1)
    rows = np.arange(n)[:, None]
    query_start = 1 + 2 * pairs
    ids[:, 1:query_start:2], ids[:, 2:query_start:2] = keys, values
    ids[:, query_start : query_start + 2 * pairs : 2] = keys[rows, order]
    ids[:, query_start + 1 : query_start + 2 * pairs : 2] = values[rows, order]
    mask[:, query_start + 1 : query_start + 2 * pairs : 2] = True
    return ids, mask


def _check_offset_diff(cfg: DataConfig) -> None:
    _require(cfg.vocab_size >= 2, "data.vocab_size", cfg.vocab_size, "offset_diff needs at least 2")
    n_steps = cfg.seq_len // 2
    for key, offset in (("data.offset_a", cfg.offset_a), ("data.offset_b", cfg.offset_b)):
        _require(offset >= 1, key, offset, "must be a positive integer")
        _require(offset < n_steps, key, offset, f"must be below seq_len // 2 = {n_steps} so that some y_t has a target")
    _require(cfg.offset_a != cfg.offset_b, "data.offset_b", cfg.offset_b, "must differ from data.offset_a")


def _make_offset_diff(rng: np.random.Generator, n: int, cfg: DataConfig) -> Arrays:
    ids, mask = _empty(n, cfg.seq_len)
    a, b, start = cfg.offset_a, cfg.offset_b, max(cfg.offset_a, cfg.offset_b)
    x = rng.integers(0, cfg.vocab_size, size=(n, (cfg.seq_len + 1) // 2))
    y = np.zeros((n, cfg.seq_len // 2), dtype=np.int64)
    t = np.arange(start, cfg.seq_len // 2)
    y[:, start:] = (x[:, t - a] - x[:, t - b]) % cfg.vocab_size
    ids[:, 0::2], ids[:, 1::2] = x, y
    mask[:, 2 * start + 1 :: 2] = True
    return ids, mask


def _check_copy(cfg: DataConfig) -> None:
    _require(cfg.seq_len >= 4, "data.seq_len", cfg.seq_len, "copy needs at least 4 (BOS, a token, SEP, its copy)")
    _require(cfg.vocab_size >= 3, "data.vocab_size", cfg.vocab_size, "copy needs at least 3 (BOS, SEP and a token)")


def _make_copy(rng: np.random.Generator, n: int, cfg: DataConfig) -> Arrays:
    ids, mask = _empty(n, cfg.seq_len)
    length = (cfg.seq_len - 2) // 2
    segment = rng.integers(2, cfg.vocab_size, size=(n, length))
    ids[:, 1 : length + 1] = segment
    ids[:, length + 1] = SEP
    ids[:, length + 2 : 2 * length + 2] = segment
    mask[:, length + 2 : 2 * length + 2] = True
    return ids, mask


DATA_SOURCES.register(
    SyntheticSource("induction", _check_induction, _make_induction, "a random segment repeated: copying by induction")
)
DATA_SOURCES.register(
    SyntheticSource(
        "assoc_recall", _check_assoc_recall, _make_assoc_recall, "key-value pairs, then the keys again: recall"
    )
)
DATA_SOURCES.register(
    SyntheticSource(
        "offset_diff", _check_offset_diff, _make_offset_diff, "y_t = x[t-a] - x[t-b] mod V: one head, two relations"
    )
)
DATA_SOURCES.register(SyntheticSource("copy", _check_copy, _make_copy, "a segment, SEP, the segment again"))


def check_synthetic(cfg: DataConfig) -> None:
    DATA_SOURCES[cfg.source].check(cfg)


def synthetic_arrays(cfg: DataConfig, split_index: int, n: int) -> Arrays:
    """n examples of cfg.source from the stream (seed, split, task): each split, seed and task gets its own data
    (without the task, induction and copy would share random draws)."""
    return DATA_SOURCES[cfg.source].make(split_rng(cfg, split_index), n, cfg)


def split_rng(cfg: DataConfig, split_index: int) -> np.random.Generator:
    """The random stream of cfg.source's split number split_index (train, val, test) under cfg.seed."""
    return np.random.default_rng((cfg.seed, split_index, synthetic_sources().index(cfg.source)))
