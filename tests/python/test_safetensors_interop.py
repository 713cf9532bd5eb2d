"""safetensors interop: files zaya writes open in the `safetensors` package, and files the package
writes open in zaya (`zaya ckpt inspect`). Run by ctest with the repo venv; ZAYA_BINARY names the
built zaya binary."""
import json
import os
import struct
import subprocess

import numpy as np
import pytest

safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

ZAYA = os.environ.get("ZAYA_BINARY", "")
if not ZAYA or not os.path.exists(ZAYA):
    pytest.skip("ZAYA_BINARY does not name a built zaya binary", allow_module_level=True)


def zaya(*args):
    return subprocess.run([ZAYA, *args], capture_output=True, text=True, timeout=60)


def read_raw(path, name):
    """Bytes of one tensor, located from the header (for dtypes numpy cannot hold, like BF16)."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8 : 8 + n])
    begin, end = header[name]["data_offsets"]
    return blob[8 + n + begin : 8 + n + end]


def test_zaya_file_opens_in_safetensors(tmp_path):
    path = str(tmp_path / "z.safetensors")
    r = zaya("ckpt", "write-test-file", path)
    assert r.returncode == 0, r.stderr
    expected = {
        "f32": np.array([[-1.0, -0.5, 0.0], [0.5, 1.0, 1.5]], dtype=np.float32),
        "i32": np.array([-1, 0, 7], dtype=np.int32),
        "i64": np.array([[2**40, 2**40 + 1], [2**40 + 2, 2**40 + 3]], dtype=np.int64),
        "u8": np.array([0, 50, 100, 150, 200], dtype=np.uint8),
        "scalar": np.array(3.5, dtype=np.float32),
    }
    with safe_open(path, framework="np") as f:
        assert set(f.keys()) == set(expected) | {"bf16"}
        assert f.metadata() == {"format": "pt"}
        for name, want in expected.items():
            got = f.get_tensor(name)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            np.testing.assert_array_equal(got, want)  # exact: the bytes are copied, not converted
    # BF16 has no numpy dtype: widen the raw bits to float32 (bf16 is the top half of an f32).
    bits = np.frombuffer(read_raw(path, "bf16"), dtype="<u2").astype(np.uint32) << 16
    np.testing.assert_array_equal(bits.view(np.float32), np.array([0.25, 0.5, 0.75, 1.0], dtype=np.float32))
    try:
        import torch
        from safetensors.torch import load_file
    except ImportError:
        return
    t = load_file(path)
    assert t["bf16"].dtype == torch.bfloat16
    assert t["bf16"].float().tolist() == [0.25, 0.5, 0.75, 1.0]


def parse_inspect(stdout):
    rows = {}
    lines = stdout.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("name"))
    for line in lines[start + 1 :]:
        name, dtype, rest = line.split(None, 2)
        shape_end = rest.index("]") + 1
        shape = json.loads(rest[:shape_end])
        nbytes, total = rest[shape_end:].split()
        rows[name] = (dtype, shape, int(nbytes), total)
    return rows


def test_safetensors_file_opens_in_zaya(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "model.layers.0.mlp.experts.gate_up_proj": rng.standard_normal((3, 4, 5)).astype(np.float32),
        "ids": np.arange(-5, 7, dtype=np.int64).reshape(3, 4),
        "mask": np.array([1, 0, 255], dtype=np.uint8),
        "counts": np.array([3, -9], dtype=np.int32),
        "half": np.array([1.5, 2.0], dtype=np.float16),  # parsed, not a zaya compute dtype
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    path = str(tmp_path / "hf.safetensors")
    save_file(tensors, path, metadata={"format": "np"})
    r = zaya("ckpt", "inspect", path)
    assert r.returncode == 0, r.stderr
    rows = parse_inspect(r.stdout)
    names = {"F32": np.float32, "I64": np.int64, "U8": np.uint8, "I32": np.int32, "F16": np.float16}
    assert set(rows) == set(tensors)
    for name, arr in tensors.items():
        dtype, shape, nbytes, total = rows[name]
        assert names[dtype] == arr.dtype.type, name
        assert shape == list(arr.shape) and nbytes == arr.nbytes, name
        if dtype == "F16":
            assert total == "-"
        else:
            # zaya sums in float64 sequentially, numpy pairwise: for these <= 60 elements the
            # orders differ by at most ~60 ulp of the running sums (~1e-14 relative); 1e-12 leaves
            # margin while any misplaced or misread element (O(1) change) still fails.
            assert float(total) == pytest.approx(float(np.sum(arr.astype(np.float64))), rel=1e-12, abs=1e-12), name


def test_damaged_file_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.safetensors"
    save_file({"x": np.ones(16, dtype=np.float32)}, str(path))
    path.write_bytes(path.read_bytes()[:-5])
    r = zaya("ckpt", "inspect", str(path))
    assert r.returncode == 2
    assert "bad.safetensors" in r.stderr and "truncated" in r.stderr


def test_checkpoint_rank_files_and_verify(tmp_path):
    run = tmp_path / "run"
    r = zaya("ckpt", "write-test-checkpoint", str(run))
    assert r.returncode == 0, r.stderr
    step = run / (run / "latest").read_text().strip()
    manifest = json.loads((step / "manifest.json").read_text())
    assert manifest["step"] == 7 and manifest["world"]["size"] == 3
    # Each rank file opens in the safetensors package, and the manifest's chunks are exactly its
    # tensors: reassembling the chunks by their offsets gives the global tensor 0..23.
    full = np.full((6, 4), -1.0, dtype=np.float32)
    for chunk in manifest["tensors"]["w"]["chunks"]:
        with safe_open(str(step / chunk["file"]), framework="np") as f:
            part = f.get_tensor("w")
        assert list(part.shape) == chunk["shape"]
        r0, c0 = chunk["offsets"]
        full[r0 : r0 + part.shape[0], c0 : c0 + part.shape[1]] = part
        raw = (step / chunk["file"]).read_bytes()[chunk["byte_begin"] : chunk["byte_end"]]
        assert raw == part.tobytes()
    np.testing.assert_array_equal(full, np.arange(24, dtype=np.float32).reshape(6, 4))

    r = zaya("ckpt", "verify", str(run))
    assert r.returncode == 0 and r.stdout.startswith("OK"), r.stdout + r.stderr
    r = zaya("ckpt", "inspect", str(run))
    assert r.returncode == 0 and "step         7" in r.stdout and '"hidden_size": 4' in r.stdout
    # One flipped data byte: verify fails with exit 1 and names the chunk.
    chunk = manifest["tensors"]["w"]["chunks"][1]
    path = step / chunk["file"]
    blob = bytearray(path.read_bytes())
    blob[chunk["byte_begin"] + 1] ^= 0x01
    path.write_bytes(bytes(blob))
    r = zaya("ckpt", "verify", str(run))
    assert r.returncode == 1 and "checksum mismatch" in r.stdout, r.stdout + r.stderr
    # Not a checkpoint at all: exit 2.
    r = zaya("ckpt", "verify", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "no such directory" in r.stderr
