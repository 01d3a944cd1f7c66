"""Example programs: a character-level GPT (``python -m holoflow.examples.gpt``) and a small CNN."""
