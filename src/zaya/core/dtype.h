// Element types and devices, and bf16 conversion (round-to-nearest-even, NaN kept quiet).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__CUDACC__)
#define ZAYA_HD __host__ __device__
#else
#define ZAYA_HD
#endif

namespace zaya {

// f64 is for reductions that must not depend on their order (deterministic gradient sums).
enum class DType : uint8_t { f32, bf16, i32, i64, u8, f64 };
enum class Device : uint8_t { cpu, cuda };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
    case DType::f64: return 8;
  }
  return 0;
}
std::string_view dtype_name(DType t);    // "f32", "bf16", ...
std::string_view device_name(Device d);  // "cpu", "cuda"

// bfloat16 as raw bits: the top 16 bits of an IEEE float32.
struct bf16 {
  uint16_t bits = 0;
};

ZAYA_HD inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
ZAYA_HD inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest, ties to even. NaN stays NaN (quiet bit forced, sign kept) instead of
// rounding into infinity; infinities and subnormals follow from the bit arithmetic.
ZAYA_HD inline bf16 to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x0040u)};
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>((u + rounding) >> 16)};
}
ZAYA_HD inline float to_float(bf16 h) { return bits_float(static_cast<uint32_t>(h.bits) << 16); }

// Maps C++ element types to DType for Tensor::data<T>().
template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };

}  // namespace zaya
