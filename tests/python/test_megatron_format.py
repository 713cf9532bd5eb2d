"""Format compatibility with megatron-core's indexed datasets, both directions.

megatron-core writes a dataset with its own IndexedDatasetBuilder and zaya reads it
(`zaya data inspect --dump-ids`); zaya writes one (`zaya data prepare`) and megatron-core's
IndexedDataset reads it. The token streams must be identical, and megatron's builder, fed zaya's
documents, must reproduce zaya's files byte for byte.

Runs under the repo venv with megatron-core installed (scripts/requirements.txt); ZAYA_BINARY
names the zaya binary.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
indexed_dataset = pytest.importorskip("megatron.core.datasets.indexed_dataset")
IndexedDataset = indexed_dataset.IndexedDataset
IndexedDatasetBuilder = indexed_dataset.IndexedDatasetBuilder

ZAYA = os.environ.get("ZAYA_BINARY")
pytestmark = pytest.mark.skipif(not ZAYA or not Path(ZAYA).exists(), reason="ZAYA_BINARY not set or not built")


def zaya(*args):
    r = subprocess.run([ZAYA, *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, f"zaya {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr}"
    return r.stdout


def zaya_documents(prefix):
    """Token ids per document, as zaya reads them."""
    out = zaya("data", "inspect", prefix, "--dump-ids")
    return [[int(t) for t in line.split()] for line in out.splitlines()]


def megatron_documents(prefix):
    """Token ids per document, as megatron-core reads them (sequences concatenated per document)."""
    ds = IndexedDataset(str(prefix))
    docs = []
    di = ds.document_indices
    for d in range(len(di) - 1):
        seqs = [np.asarray(ds[s]) for s in range(di[d], di[d + 1])]
        docs.append([int(t) for t in np.concatenate(seqs)] if seqs else [])
    return docs, ds


@pytest.mark.parametrize("dtype,high", [(np.uint16, 65535), (np.int32, 262271)])
def test_zaya_reads_megatron(tmp_path, dtype, high):
    rng = np.random.default_rng(0)
    prefix = tmp_path / "mega"
    builder = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=dtype)
    expected = []
    for n in [5, 1, 37, 0, 200, 3]:
        doc = rng.integers(0, high + 1, size=n)
        doc[-1:] = high  # the top of the range survives
        builder.add_document(doc, [n])
        expected.append([int(t) for t in doc])
    # A document of two sequences (add_item + end_document): zaya concatenates them.
    a, b = rng.integers(0, high + 1, size=4), rng.integers(0, high + 1, size=6)
    builder.add_item(torch.tensor(a.astype(np.int64)))
    builder.add_item(torch.tensor(b.astype(np.int64)))
    builder.end_document()
    expected.append([int(t) for t in np.concatenate([a, b])])
    builder.finalize(str(prefix) + ".idx")

    assert zaya_documents(prefix) == expected
    summary = zaya("data", "inspect", prefix)
    assert ("uint16" if dtype == np.uint16 else "int32") in summary
    assert "documents: 7" in summary and "sequences: 8" in summary


def test_megatron_reads_zaya(tmp_path):
    corpus = tmp_path / "corpus.txt"
    words = "the loader packs documents of tokens into samples while the model trains on python text".split()
    rng = np.random.default_rng(1)
    paragraphs = [" ".join(rng.choice(words, size=rng.integers(3, 30))) + ".\n" for _ in range(200)]
    corpus.write_text("\n".join(paragraphs))
    prefix = tmp_path / "z"
    zaya("data", "prepare", "--input", corpus, "--vocab", 320, "--out", prefix, "--doc-split", "paragraph",
         "--val-fraction", 0.1)

    for split in ["train", "val"]:
        p = Path(f"{prefix}_{split}")
        ours = zaya_documents(p)
        theirs, ds = megatron_documents(p)
        assert ds.index.dtype == np.uint16
        assert theirs == ours
        assert len(ours) > 0 and all(doc[-1] == 1 for doc in ours)  # EOS terminates every document
        # megatron's builder, given the same documents, writes the same bytes.
        re_prefix = tmp_path / f"rebuilt_{split}"
        builder = IndexedDatasetBuilder(str(re_prefix) + ".bin", dtype=np.uint16)
        for doc in ours:
            builder.add_document(np.asarray(doc), [len(doc)])
        builder.finalize(str(re_prefix) + ".idx")
        for ext in [".bin", ".idx"]:
            assert Path(str(re_prefix) + ext).read_bytes() == Path(str(p) + ext).read_bytes(), ext
