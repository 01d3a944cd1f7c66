"""flow.load recognises formats by content (thousands of random checkpoints); temp files of a
save killed by SIGKILL are named, and cleaned by the next save of the same target."""
import io
import os
import signal
import struct
import subprocess
import sys
import time

import pytest
import torch

import holoflow as flow
from holoflow import serialization as S

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8,
          torch.bool]


def _random_tree(g: torch.Generator):
    def rint(n):
        return int(torch.randint(0, n, (), generator=g))
    tree = {}
    for i in range(rint(6)):
        shape = tuple(rint(5) for _ in range(rint(4)))
        dt = DTYPES[rint(len(DTYPES))]
        t = (torch.rand(shape, generator=g) * 100).to(dt)
        tree[f"t{i}_" + "x" * rint(40)] = flow.from_torch(t)
    if rint(2):
        tree["meta"] = {"step": rint(1000), "name": "n" * rint(30), "lrs": [0.1] * rint(4)}
    return tree


def _same(a, b):
    assert type(a) is type(b) or (isinstance(a, flow.Tensor) and isinstance(b, flow.Tensor))
    if isinstance(a, flow.Tensor):
        assert a.dtype == b.dtype and torch.equal(a.to_torch(), b.to_torch())
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    else:
        assert a == b


def test_thousands_of_random_checkpoints_load_back(tmp_path):
    g = torch.Generator().manual_seed(13)
    low_0x80 = 0
    for i in range(2000):
        tree = _random_tree(g)
        buf = io.BytesIO()
        flow.save(tree, buf)
        data = buf.getvalue()
        low_0x80 += data[0] == 0x80      # the case once misread as a pickle
        if i % 40 == 0:                  # some through real files (the path-based reader; fsync is slow)
            path = tmp_path / f"c{i % 80}.hf"
            flow.save(tree, path)
            _same(tree, flow.load(path))
        else:
            _same(tree, flow.load(io.BytesIO(data)))
    assert low_0x80 > 15, f"only {low_0x80} headers with low byte 0x80: the case is not exercised"


def test_header_length_with_low_byte_0x80(tmp_path):
    # a header whose length is 0x80 + 256 k, built by padding the manifest's metadata
    for pad in range(0, 400):
        buf = io.BytesIO()
        S.save_file({"a": flow.ones(2), "pad": "p" * pad}, buf)
        if buf.getvalue()[0] == 0x80:
            break
    else:
        pytest.fail("no padding gave a header length with low byte 0x80")
    path = tmp_path / "x.hf"
    path.write_bytes(buf.getvalue())
    assert flow.load(path)["a"].tolist() == [1.0, 1.0]


def test_torch_formats_and_garbage_still_recognised(tmp_path):
    torch.save({"z": torch.ones(2)}, tmp_path / "zip.pt")
    torch.save({"p": torch.ones(3)}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    assert flow.load(tmp_path / "zip.pt")["z"].tolist() == [1.0, 1.0]
    assert flow.load(tmp_path / "legacy.pt")["p"].tolist() == [1.0] * 3
    flow.save({"w": flow.randn(100)}, tmp_path / "t.hf")
    data = (tmp_path / "t.hf").read_bytes()
    (tmp_path / "cut.hf").write_bytes(data[:-8])
    with pytest.raises(S.CheckpointError, match=r"cut\.hf.*truncated safetensors file: tensor '0'"):
        flow.load(tmp_path / "cut.hf")
    (tmp_path / "bad.hf").write_bytes(struct.pack("<Q", 6) + b"{nope}" + b"\0" * 10)
    with pytest.raises(S.CheckpointError, match=r"bad\.hf.*not a valid checkpoint.*not JSON"):
        flow.load(tmp_path / "bad.hf")
    (tmp_path / "short.hf").write_bytes(b"abc")
    with pytest.raises(S.CheckpointError, match=r"short\.hf.*not a valid checkpoint"):
        flow.load(tmp_path / "short.hf")


# -- temp files ------------------------------------------------------------------------------
KILLED_SAVER = """
import sys, holoflow as flow, torch
big = {"w": flow.from_torch(torch.zeros(8_000_000))}   # 32 MB: long enough to be killed mid-write
print("ready", flush=True)
while True:
    flow.save(big, sys.argv[1])
"""


def _temps(d, target="ckpt.hf"):
    return sorted(p for p in os.listdir(d) if p.startswith(target + ".holoflow-tmp-"))


def test_sigkill_mid_save_leaves_named_temp_that_next_save_cleans(tmp_path):
    target = tmp_path / "ckpt.hf"
    flow.save({"w": flow.zeros(3)}, target)
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_SAVER, str(target)], env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 60
        while not _temps(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.002)
        assert _temps(tmp_path), "the saver never wrote a temp file"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    left = _temps(tmp_path)
    assert left == [f"ckpt.hf.holoflow-tmp-{proc.pid}"] or left == [], left
    if not left:   # it finished the write between our look and the kill: leave one by hand
        (tmp_path / f"ckpt.hf.holoflow-tmp-{proc.pid}").write_bytes(b"partial")
    w = flow.load(target)["w"]                      # the previous checkpoint is intact
    assert w.shape in ((3,), (8_000_000,))
    live = tmp_path / f"ckpt.hf.holoflow-tmp-{os.getpid()}-7"   # a live process's temp: kept
    live.write_bytes(b"in progress")
    other = tmp_path / "other.hf.holoflow-tmp-1"               # another target's: not ours to clean
    other.write_bytes(b"x")
    flow.save({"w": flow.ones(2)}, target)
    assert _temps(tmp_path) == [live.name] and other.exists()
    assert flow.load(target)["w"].tolist() == [1.0, 1.0]


def _deep(levels):
    return '{"t": "list", "items": [' * levels + '{"t": "value", "v": 1}' + "]}" * levels


BAD_MANIFESTS = [   # (manifest text, stored dtype, what the error must say)
    ('{"format": "holoflow", "version": 1, "root": ' + _deep(3000) + "}", torch.float32, "nested too deeply"),
    ('{"format": "holoflow", "version": 1, "root": ' + _deep(300) + "}", torch.float32, "nested more than 200"),
    ('{"format": "holoflow", "version": 1, "root": ' + "[" * 100000 + "]" * 100000 + "}", torch.float32,
     "nested too deeply"),
    ('{"format": "holoflow", "version": 1, "root": {"t": "dict", "items": [[{"t": "list", "items": []}, '
     '{"t": "value", "v": 1}]]}}', torch.float32, "a dict key holds a list"),
    ('{"format": "holoflow", "version": 1, "root": {"t": "dict", "items": [[{"t": "tuple", "items": '
     '[{"t": "list", "items": []}]}, {"t": "value", "v": 1}]]}}', torch.float32, "a dict key holds a list"),
    ('{"format": "holoflow", "version": 1, "root": {"t": "tensor", "key": ["0"], "codec": "local"}}',
     torch.float32, r"key is \['0'\], not a string"),
    ('{"format": "holoflow", "version": "x", "root": {"t": "value", "v": 1}}', torch.float32,
     "version 'x' is not an int"),
    ('{"format": "holoflow", "version": 1, "root": {"t": "tensor", "key": "0", "codec": "local", '
     '"requires_grad": true}}', torch.int64, "int64 is marked requires_grad"),
]


@pytest.mark.parametrize("text,dtype,message", BAD_MANIFESTS, ids=[f"bad{i}" for i in range(len(BAD_MANIFESTS))])
def test_bad_manifests_raise_checkpoint_errors(tmp_path, text, dtype, message):
    import safetensors.torch
    path = tmp_path / "m.hf"
    safetensors.torch.save_file({"0": torch.ones(1, dtype=dtype)}, str(path), metadata={"holoflow": text})
    with pytest.raises(S.CheckpointError, match=r"m\.hf.*" + message):
        flow.load(path)


def test_torch_save_and_load_arguments_and_parameters(tmp_path):
    """torch.save's pickle/zip options and torch.load's mmap=, pickle_load_args and a map_location
    function are taken (they were TypeErrors / an invalid device string); a Parameter loads as a
    Parameter with its requires_grad, as torch's (it loaded as a plain tensor)."""
    p = flow.nn.Parameter(flow.arange(6.0).reshape(2, 3))
    frozen = flow.nn.Parameter(flow.ones(2), requires_grad=False)
    path = str(tmp_path / "ck.pt")
    flow.save({"p": p, "frozen": frozen, "t": flow.ones(1)}, path, _use_new_zipfile_serialization=False,
              pickle_protocol=4)
    for kwargs in (dict(mmap=True), dict(map_location=lambda storage, loc: storage), dict(map_location="cpu")):
        got = flow.load(path, weights_only=True, **kwargs)
        assert type(got["p"]) is flow.nn.Parameter and got["p"].requires_grad and got["p"].tolist() == p.tolist()
        assert type(got["frozen"]) is flow.nn.Parameter and not got["frozen"].requires_grad
        assert type(got["t"]) is flow.Tensor
    tpath = str(tmp_path / "torch.pt")
    torch.save({"p": torch.nn.Parameter(torch.ones(3)), "w": torch.zeros(2)}, tpath)
    for kwargs in (dict(mmap=True), dict(map_location=lambda storage, loc: storage), dict(encoding="latin1")):
        got = flow.load(tpath, **kwargs)
        assert type(got["p"]) is flow.nn.Parameter and got["p"].requires_grad and type(got["w"]) is flow.Tensor
    with pytest.raises(RuntimeError, match="explicit pickle_module"):
        flow.load(path, pickle_module=__import__("pickle"))
