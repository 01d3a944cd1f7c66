"""The session-wide Gloo worlds (fixtures ``world2``, ``world4``) live in tests/conftest.py, built
on tests/dist/pool.py, so every suite shares one set of rank processes."""
