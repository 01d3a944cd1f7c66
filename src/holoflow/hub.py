"""``holoflow.hub``: downloading models needs the network, which holoflow does not use; each
entry point raises naming what to do instead."""
from __future__ import annotations

import os
from typing import Any

__all__ = ["load", "list", "help", "load_state_dict_from_url", "download_url_to_file", "get_dir", "set_dir"]

_DIR = [os.path.join(os.path.expanduser("~"), ".cache", "holoflow", "hub")]


def _no_network(what: str) -> RuntimeError:
    return RuntimeError(f"holoflow.hub.{what}: holoflow does not download models (no network access). "
                        f"Download the checkpoint yourself and load it with holoflow.load(path) or "
                        f"holoflow.utils.convert.from_torch_file(path)")


def load(repo_or_dir: str, model: str, *args: Any, **kwargs: Any) -> Any:
    raise _no_network("load")


def list(github: str, *args: Any, **kwargs: Any) -> Any:  # noqa: A001 - torch's name
    raise _no_network("list")


def help(github: str, model: str, *args: Any, **kwargs: Any) -> Any:  # noqa: A001 - torch's name
    raise _no_network("help")


def load_state_dict_from_url(url: str, *args: Any, **kwargs: Any) -> Any:
    raise _no_network("load_state_dict_from_url")


def download_url_to_file(url: str, dst: str, *args: Any, **kwargs: Any) -> None:
    raise _no_network("download_url_to_file")


def get_dir() -> str:
    """The hub cache directory (nothing is downloaded into it by holoflow)."""
    return _DIR[0]


def set_dir(d: str) -> None:
    _DIR[0] = os.path.expanduser(d)
