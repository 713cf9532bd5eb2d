"""While one of zaya's two threads spins in libgomp (waiting at a barrier or for the next parallel
region), what is the other one doing? Reads `perf script` output of a 2-thread run sampled on
cpu-clock with call graphs, pairs each libgomp sample of one thread with the other thread's sample
nearest in time, and counts the other thread's function (its innermost frame in zaya, or its top
frame; "[JIT]" for oneDNN's generated GEMM code). The list says which kernels leave a thread
waiting at their end.

  perf record -e cpu-clock -F 2000 -g -o /tmp/perf.data build/cuda/zaya --threads 2 bench step \\
      --init-config configs/demo.toml --seed 1 --steps 20 --batch 8 --seq 256
  perf script -i /tmp/perf.data -F tid,time,ip,sym,dso > /tmp/perf.txt
  python3 tools/perf_spin_attribution.py /tmp/perf.txt [--top 25]

The counts include start-up (model init: fill_host, log/cos/sin), which the spin share does too.
"""
import argparse
import bisect
import collections
import re

FRAME = re.compile(r"\s*(\S+)\s+(.*)\((.*)\)\s*$")
HEADER = re.compile(r"^\s*(\d+)\s+([\d.]+):\s*$")


def read_samples(path):
    """[(tid, time, top symbol, top dso, innermost zaya symbol or None)] from perf script output."""
    samples, cur = [], None
    with open(path, errors="replace") as f:
        for line in f:
            if not line.strip():
                if cur:
                    samples.append(cur)
                cur = None
                continue
            h = HEADER.match(line)
            if h:  # "TID TIME:" (the TID right-aligned) opens a sample; its frames follow, innermost first
                if cur:
                    samples.append(cur)
                cur = [int(h.group(1)), float(h.group(2)), None, None, None]
                continue
            m = FRAME.match(line)
            if not m or cur is None:
                continue
            sym, dso = m.group(2).strip(), m.group(3)
            if cur[2] is None:
                cur[2], cur[3] = sym, dso
            if cur[4] is None and dso.endswith("/zaya"):
                cur[4] = sym
    if cur:
        samples.append(cur)
    return samples


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("perf_script_output")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    samples = read_samples(a.perf_script_output)
    by_tid = collections.defaultdict(list)
    for s in samples:
        by_tid[s[0]].append(s)
    tids = sorted(by_tid, key=lambda k: -len(by_tid[k]))[:2]
    if len(tids) < 2:
        raise SystemExit("need samples from two threads")
    times = {t: [s[1] for s in by_tid[t]] for t in tids}
    other_doing = collections.Counter()
    spins = 0
    for me, other in ((tids[0], tids[1]), (tids[1], tids[0])):
        for s in by_tid[me]:
            if not (s[3] and "libgomp" in s[3]):
                continue
            spins += 1
            i = bisect.bisect_left(times[other], s[1])
            j = min((j for j in (i - 1, i) if 0 <= j < len(times[other])), key=lambda j: abs(times[other][j] - s[1]))
            o = by_tid[other][j]
            key = (o[4] or o[2] or "?")[:100]
            if o[3] and "libgomp" in o[3]:
                key = "(both in libgomp) " + key
            elif o[3] and ("JIT" in o[3] or "perf-" in o[3]):
                key = "[JIT] " + key
            other_doing[key] += 1
    print(f"libgomp samples: {spins} of {len(samples)} ({100.0 * spins / max(1, len(samples)):.1f}%)")
    print("the other thread meanwhile:")
    for k, v in other_doing.most_common(a.top):
        print(f"{v:7d}  {k}")


if __name__ == "__main__":
    main()
