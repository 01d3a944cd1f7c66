"""Imported once by the fork server that pool.py's rank processes are forked from: torch and
holoflow, as a spawned rank imports them (one OpenMP thread: the ranks run with one each), and
nothing run. Importing is all it does: no thread is started and no kernel is run, so a fork of it
is a clean process."""
import os

os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402, F401

import holoflow  # noqa: E402, F401

