"""The default training text: Python standard-library source that every installation ships.

No download: the ``.py`` files of a fixed list of stdlib modules, read in a fixed order, give a
few hundred KB of text. Characters outside printable ASCII become ``?`` so the vocabulary is
small and the same on every platform (the text itself varies a little across Python versions).
"""
from __future__ import annotations

import importlib.util
import string

import numpy as np

# pure-Python modules present on every CPython 3.10+ build (no optional C extensions needed)
MODULES = (
    "textwrap", "string", "shlex", "fnmatch", "glob", "heapq", "bisect", "keyword", "copy",
    "functools", "contextlib", "dataclasses", "abc", "numbers", "fractions", "random", "statistics",
    "difflib", "argparse", "csv", "json.decoder", "json.encoder", "base64", "calendar", "colorsys",
    "enum", "gettext", "graphlib", "ipaddress", "operator", "pprint", "queue", "reprlib", "sched",
    "secrets", "shutil", "tempfile", "timeit", "tokenize", "traceback", "types", "uuid", "weakref",
)
VOCAB = "\n" + string.printable[:95]  # newline + the 95 printable ASCII characters (space .. ~)
_INDEX = {c: i for i, c in enumerate(VOCAB)}
_UNKNOWN = _INDEX["?"]


def module_source(name: str) -> str:
    """The source text of stdlib module ``name`` ('' if this installation lacks it)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return ""
    with open(spec.origin, encoding="utf-8") as f:
        return f.read()


def load_text(max_chars: int = 400_000) -> str:
    """The corpus: the listed modules' sources, concatenated in order, cut at ``max_chars``."""
    parts, total = [], 0
    for name in MODULES:
        src = module_source(name).replace("\t", "    ").replace("\r", "")
        parts.append(src)
        total += len(src)
        if total >= max_chars:
            break
    return "".join(parts)[:max_chars]


def encode(text: str) -> np.ndarray:
    """Characters to token ids (int64); unknown characters map to ``?``."""
    return np.fromiter((_INDEX.get(c, _UNKNOWN) for c in text), dtype=np.int64, count=len(text))


def decode(ids) -> str:
    """Token ids back to text."""
    return "".join(VOCAB[int(i)] for i in ids)


def splits(max_chars: int = 400_000, val_fraction: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """Encoded (train, val) token arrays: the last ``val_fraction`` of the text is validation."""
    data = encode(load_text(max_chars))
    n_val = int(len(data) * val_fraction)
    return data[:-n_val], data[-n_val:]


def get_batch(data: np.ndarray, block_size: int, batch_size: int,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random windows ``x`` (batch, block) and their next-character targets ``y``."""
    starts = rng.integers(0, len(data) - block_size - 1, size=batch_size)
    idx = starts[:, None] + np.arange(block_size)[None, :]
    return data[idx], data[idx + 1]
