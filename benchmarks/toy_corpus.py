"""The trainer tests' toy model and corpus (tests/train/toy.h's shapes), for benchmarks that drive
`zaya train` on them: the [model] section of a 2-layer, 3-expert model with a 64-token vocabulary,
and a corpus of 40 documents of 30 runs of six consecutive ids, EOS-terminated, written as a
Megatron indexed dataset (docs/data.md) of uint16."""
import random
import struct

MODEL = """[model]
vocab_size = 64
hidden_size = 32
num_hidden_layers = 2
num_attention_heads = 2
num_key_value_heads = 1
head_dim = 16
num_experts = 3
moe_intermediate_size = 32
router_hidden_size = 32
max_position_embeddings = 64
"""


def write_corpus(prefix, seed=7, first=4, docs=40):
    rng = random.Random(seed)
    rows = []
    for _ in range(docs):
        doc = []
        for _ in range(30):
            start = first + rng.randrange(50)
            doc.extend(range(start, start + 6))
        doc.append(1)
        rows.append(doc)
    with open(prefix + ".bin", "wb") as f:
        for d in rows:
            f.write(struct.pack("<%dH" % len(d), *d))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<QBQQ", 1, 8, len(rows), len(rows) + 1))
        f.write(struct.pack("<%di" % len(rows), *[len(d) for d in rows]))
        offsets, at = [], 0
        for d in rows:
            offsets.append(at)
            at += 2 * len(d)
        f.write(struct.pack("<%dq" % len(rows), *offsets))
        f.write(struct.pack("<%dq" % (len(rows) + 1), *range(len(rows) + 1)))
