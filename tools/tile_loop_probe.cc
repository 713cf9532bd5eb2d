// One core running the fused tied head's tile loops on synthetic panels, to see what the memory
// hierarchy costs them apart from everything else in the head (the kernel is the head's 16 × 16
// FMA-chain tile, as in src/zaya/ops/cpu/tied_head_cpu.cc). Best of 5 passes each:
//
//   forward STRIPS GROUP [prefetch|ksplit]: for each of STRIPS 16 KiB panels of Eᵀ (hd = 256), the
//     GROUP token blocks' tiles against it, as the forward's loop for one token group. STRIPS 512
//     streams 8 MiB of panels (the demo's Eᵀ) from L3, 64 keeps 1 MiB in L2. `prefetch` has each
//     tile ask for its share of the next panel (the kept code); `ksplit` makes each tile in two
//     halves of k so the panels touched at once fit a 48 KiB L1.
//   blocks LDA: the forward in vocabulary blocks, outermost, with an 8 × 32 register block; its
//     8-token A panels are halves of 16-wide panels (16) or packed 8 wide (8).
//   de-tasks KERNEL: dE's loop as kept (tasks of 16 strips over 256-token blocks, each strip's piece
//     held in L1 while the 16 panels of r ⊙ h pass), with 16 × 16 tiles (16, the kept kernel), 8 × 32
//     blocks (8), 8 × 32 blocks with two panels held in L1 and the strip pieces streamed (0), or
//     16 × 16 tiles of two strips in turn per 8 KiB panel piece over 128-token blocks (2): session
//     15's tries at the forward's gain for dE, none faster than 16.
//   de TOKEN_BLOCK: dE's loop over 256 strips × 16 panels of r ⊙ h (2048 tokens), summing tokens in
//     blocks of TOKEN_BLOCK, all strips per block (session 13's arrangement): 2048 reads r ⊙ h's
//     2 MiB of panels once per strip.
//
//   g++ -std=c++20 -O3 -march=native tools/tile_loop_probe.cc -o /tmp/tile_loop_probe
//   taskset -c 0 /tmp/tile_loop_probe forward 512 2 prefetch
//   taskset -c 0 /tmp/tile_loop_probe blocks 8
//   taskset -c 0 /tmp/tile_loop_probe de-tasks 16
//   taskset -c 0 /tmp/tile_loop_probe de 256
// Alternate the variants a few times: on a shared VM the minute moves every figure.
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

template <bool kPrefetch, bool kAccumulate>
__attribute__((noinline)) void tile(float* out, const float* a, const float* b, int64_t kc, const float* next) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = kAccumulate ? _mm512_load_ps(out + i * 16) : _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    if (kPrefetch && k % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(next + k * 8), _MM_HINT_T1);
    const __m512 bv = _mm512_load_ps(b + k * 16);
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(a[k * 16 + i]), bv, acc[i]);
  }
  for (int i = 0; i < 16; ++i) _mm512_store_ps(out + i * 16, acc[i]);
}

float* filled(int64_t n, int mod) {
  auto* p = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(n + 64) * sizeof(float)));
  for (int64_t i = 0; i < n + 64; ++i) p[i] = static_cast<float>(i % mod) * 0.1f;
  return p;
}

template <class F>
double best_seconds(F&& pass) {
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// The 8 × 32 register block: acc[i][v] = Σ_k a[k·lda + i]·b_v[k·16 + lane] over k < kc (8 broadcasts
// and 2 vector loads per 16 FMAs), optionally asking for `next` (one line per two k) into L1.
void block8x32(__m512 (&acc)[8][2], const float* a, int64_t lda, const float* b0, const float* b1, int64_t kc,
               const float* next = nullptr) {
  for (auto& row : acc)
    for (__m512& v : row) v = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    if (next && k % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(next + k * 8), _MM_HINT_T0);
    const __m512 x0 = _mm512_load_ps(b0 + k * 16), x1 = _mm512_load_ps(b1 + k * 16);
    for (int i = 0; i < 8; ++i) {
      const __m512 av = _mm512_set1_ps(a[k * lda + i]);
      acc[i][0] = _mm512_fmadd_ps(av, x0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(av, x1, acc[i][1]);
    }
  }
}

// C rows (8, ldc apart) += acc: the dE loops' epilogue.
void add_block(float* c, int64_t ldc, const __m512 (&acc)[8][2]) {
  for (int i = 0; i < 8; ++i)
    for (int v = 0; v < 2; ++v)
      _mm512_storeu_ps(c + i * ldc + v * 16, _mm512_add_ps(_mm512_loadu_ps(c + i * ldc + v * 16), acc[i][v]));
}

void forward(int64_t strips, int64_t group, const char* mode) {
  constexpr int64_t hd = 256;
  const bool prefetch = std::strcmp(mode, "prefetch") == 0, ksplit = std::strcmp(mode, "ksplit") == 0;
  float* bt = filled((strips + 1) * hd * 16, 7);
  float* ap = filled(group * 16 * hd, 5);
  float* lg = filled(strips * group * 256, 3);
  const int64_t reps = 8192 / strips * 8;  // the same FLOPs whatever STRIPS
  const double s = best_seconds([&] {
    for (int64_t r = 0; r < reps; ++r)
      for (int64_t st = 0; st < strips; ++st)
        for (int64_t q = 0; q < (ksplit ? 2 : 1); ++q)
          for (int64_t b = 0; b < group; ++b) {
            float* out = lg + (st * group + b) * 256;
            const int64_t kc = ksplit ? hd / 2 : hd, k0 = q * kc;
            const float* a = ap + b * 16 * hd + k0 * 16;
            const float* bp = bt + st * hd * 16 + k0 * 16;
            if (prefetch)
              tile<true, false>(out, a, bp, kc, bt + (st + 1) * hd * 16 + b * (hd * 16 / group));
            else if (q > 0)
              tile<false, true>(out, a, bp, kc, nullptr);
            else
              tile<false, false>(out, a, bp, kc, nullptr);
          }
  });
  std::printf("forward strips %ld (Eᵀ %ld KiB) group %ld %s: %.1f GFLOP/s\n", static_cast<long>(strips),
              static_cast<long>(strips * 16), static_cast<long>(group), mode,
              2.0 * 256 * hd * strips * group * reps / s / 1e9);
}

// The forward as it is now (tied_head_cpu.cc): vocabulary blocks of 2 strips outermost, their Eᵀ
// panels (32 KiB) held in L1 while all 2048 tokens pass in 8-token halves of 16-token panels, an
// 8 × 32 register block per call, stored into the strip layout (the softmax left out).
void blocks(int64_t lda) {
  constexpr int64_t hd = 256, n16 = 2048, strips = 512;
  float* bt = filled(strips * hd * 16, 7);
  float* ap = filled((n16 + 16) * hd, 5);
  float* e = filled(strips * n16 * 16, 3);
  const double s = best_seconds([&] {
    for (int64_t s0 = 0; s0 < strips; s0 += 2)
      for (int64_t p = 0; p < n16 / 16; ++p)
        for (int64_t half = 0; half < 2; ++half) {
          // lda 16: the halves of a 16-token panel; 8: compact 8-token panels, one after the other.
          const float* a = lda == 16 ? ap + p * hd * 16 + half * 8 : ap + (2 * p + half) * hd * 8;
          const float* b = bt + s0 * hd * 16;
          const float* next = lda == 16 ? ap + (p + 1) * hd * 16 + half * hd * 8 : a + 2 * hd * 8;
          __m512 acc[8][2];
          block8x32(acc, a, lda, b, b + hd * 16, hd, next);
          float* et = e + s0 * n16 * 16 + (p * 16 + half * 8) * 16;
          for (int i = 0; i < 8; ++i) {
            _mm512_stream_ps(et + i * 16, acc[i][0]);
            _mm512_stream_ps(et + n16 * 16 + i * 16, acc[i][1]);
          }
        }
  });
  std::printf("forward in vocabulary blocks (8 x 32 register block, A panels %ld wide): %.1f GFLOP/s\n",
              static_cast<long>(lda), 2.0 * strips * 16 * hd * n16 / s / 1e9);
}

// dE row block (16 rows, 256 floats apart) += a 16 × 16 tile: the dE loops' epilogue.
void add_tile(float* c, const float* t) {
  for (int i = 0; i < 16; ++i)
    _mm512_storeu_ps(c + i * 256, _mm512_add_ps(_mm512_loadu_ps(c + i * 256), _mm512_load_ps(t + i * 16)));
}

// dE's loop as kept (tied_head_cpu.cc): tasks of 16 strips over 256-token blocks, and the
// arrangements session 15 tried against it (KERNEL):
//   16  each strip's piece (16 KiB) held in L1 while the block's 16 panels of r ⊙ h (256 KiB, L2)
//       pass, 16 × 16 tiles (the kept code);
//   8   the same order, 8 × 32 blocks: half a strip against two panels;
//   0   8 × 32 blocks with two panels (32 KiB) held in L1 and the strips' halves streamed;
//   2   16 × 16 tiles over 128-token blocks, two strips' tiles in turn against each 8 KiB panel
//       piece, which the second reads from L1.
void de_tasks(int kernel) {
  constexpr int64_t n16 = 2048, panels = 16, strips = 512, group = 16, tb = 256;
  float* e = filled(strips * n16 * 16, 7);
  float* rh = filled(panels * n16 * 16, 5);
  std::vector<float> dE(static_cast<size_t>(strips * 16 * 256));
  alignas(64) float t[256];
  auto piece = [&](int64_t st, int64_t t0) { return e + st * n16 * 16 + t0 * 16; };
  auto panel = [&](int64_t p, int64_t t0) { return rh + p * n16 * 16 + t0 * 16; };
  auto rows = [&](int64_t st, int64_t p) { return dE.data() + st * 16 * 256 + p * 16; };
  auto block = [&](int64_t st, int64_t half, int64_t p, int64_t t0) {  // one 8 × 32 block
    __m512 acc[8][2];
    block8x32(acc, piece(st, t0) + half * 8, 16, panel(p, t0), panel(p + 1, t0), tb);
    add_block(rows(st, p) + half * 8 * 256, 256, acc);
  };
  const double s = best_seconds([&] {
    for (int64_t g0 = 0; g0 < strips; g0 += group) {
      if (kernel == 2) {
        for (int64_t t0 = 0; t0 < n16; t0 += tb / 2)
          for (int64_t st = g0; st < g0 + group; st += 2)
            for (int64_t p = 0; p < panels; ++p)
              for (int64_t q = 0; q < 2; ++q) {
                tile<false, false>(t, piece(st + q, t0), panel(p, t0), tb / 2, nullptr);
                add_tile(rows(st + q, p), t);
              }
        continue;
      }
      for (int64_t t0 = 0; t0 < n16; t0 += tb) {
        if (kernel == 0) {
          for (int64_t p = 0; p < panels; p += 2)
            for (int64_t st = g0; st < g0 + group; ++st)
              for (int64_t half = 0; half < 2; ++half) block(st, half, p, t0);
          continue;
        }
        for (int64_t st = g0; st < g0 + group; ++st) {
          if (kernel == 16) {
            for (int64_t p = 0; p < panels; ++p) {
              tile<false, false>(t, piece(st, t0), panel(p, t0), tb, nullptr);
              add_tile(rows(st, p), t);
            }
          } else {
            for (int64_t half = 0; half < 2; ++half)
              for (int64_t p = 0; p < panels; p += 2) block(st, half, p, t0);
          }
        }
      }
    }
  });
  std::printf("dE in 16-strip tasks, %s: %.1f GFLOP/s\n",
              kernel == 16  ? "16 x 16 tiles"
              : kernel == 8 ? "8 x 32 blocks"
              : kernel == 2 ? "16 x 16 tiles, strip pairs over 128 tokens"
                            : "8 x 32 blocks, panels held",
              2.0 * strips * 16 * 256 * n16 / s / 1e9);
}

void de(int64_t token_block) {
  constexpr int64_t n16 = 2048, panels = 16, strips = 256;
  float* e = filled(strips * n16 * 16, 7);
  float* rh = filled(panels * n16 * 16, 5);
  std::vector<float> dE(static_cast<size_t>(strips * 16 * 256));
  alignas(64) float t[256];
  const double s = best_seconds([&] {
    for (int64_t t0 = 0; t0 < n16; t0 += token_block)
      for (int64_t st = 0; st < strips; ++st)
        for (int64_t p = 0; p < panels; ++p) {
          tile<false, false>(t, e + st * n16 * 16 + t0 * 16, rh + p * n16 * 16 + t0 * 16, token_block, nullptr);
          add_tile(dE.data() + st * 16 * 256 + p * 16, t);
        }
  });
  std::printf("dE token block %ld: %.1f GFLOP/s\n", static_cast<long>(token_block),
              2.0 * strips * 16 * 256 * n16 / s / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 4 && std::strcmp(argv[1], "forward") == 0) {
    forward(std::atol(argv[2]), std::atol(argv[3]), argc > 4 ? argv[4] : "plain");
  } else if (argc == 3 && std::strcmp(argv[1], "blocks") == 0 &&
             (std::atol(argv[2]) == 8 || std::atol(argv[2]) == 16)) {
    blocks(std::atol(argv[2]));
  } else if (argc == 3 && std::strcmp(argv[1], "de-tasks") == 0 &&
             (std::atol(argv[2]) == 0 || std::atol(argv[2]) == 2 || std::atol(argv[2]) == 8 ||
              std::atol(argv[2]) == 16)) {
    de_tasks(static_cast<int>(std::atol(argv[2])));
  } else if (argc == 3 && std::strcmp(argv[1], "de") == 0 && std::atol(argv[2]) > 0 &&
             2048 % std::atol(argv[2]) == 0) {
    de(std::atol(argv[2]));
  } else {
    std::fprintf(
        stderr,
        "usage: %s forward STRIPS GROUP [prefetch|ksplit] | blocks 8|16 | de-tasks 16|8|0|2 | de TOKEN_BLOCK "
        "(a divisor of 2048)\n",
        argv[0]);
    return 2;
  }
}
