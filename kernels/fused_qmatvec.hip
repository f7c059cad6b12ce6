// The decode products of a llama layer on int8-quantized activations (qmatvec.hip's formats and dot
// products) with the layer's small ops folded in, for weights that cannot share one buffer: q, k and v
// (or gate and up) each come as their own matrix, each of its own type. A Q4_K_M file has attn_q and
// attn_k in Q4_K but attn_v in Q6_K, so the concatenated W of fused_matvec.hip does not exist there.
//
//   qmatvec_norm_rope(q, k, v, Wq, Wk, Wv, x, g, positions, freq_factors, types, q_rows, kv_rows, cols, batch,
//                     head_dim, rope_dim, eps, theta, freq_scale)
//       q = rope(n @ Wq^T), k = rope(n @ Wk^T), v = n @ Wv^T,  n = rmsnorm(x) * g; freq_factors: rope_dim / 2
//       per-pair divisors of the frequency (rope.hip), or null
//   qmatvec_norm_swiglu(y, Wg, Wu, x, g, types, rows, cols, batch, eps)
//       y = silu(n @ Wg^T) * (n @ Wu^T)
//   qmatvec_add(y, W, x, type, rows, cols, batch)        y += x @ W^T (the residual connection)
//   qmatvec_norm(y, W, x, g, type, rows, cols, batch, eps)   y = n @ W^T (the output head)
//
// `types` packs one type code per matrix, 4 bits each (q | k << 4 | v << 8; gate | up << 4); the codes
// are WeightType's. The type is a branch per row group, uniform across the warp.
//
// The norm: rmsnorm(x) * g = s * (x * g) with s = 1 / sqrt(mean(x^2) + eps) a scalar per token, so the
// products run on x * g, quantized per slice as qmatvec quantizes x, and s scales the sums. A lane's
// slices cover x once per row group, so the squares summed beside the quantization give mean(x^2) after
// one warp reduction: no separate pass, no shared memory, no barrier.
//
// Work: a warp takes four rows of one matrix at a time in decoding (two at 2..4 tokens, which keeps a
// RoPE pair in one warp), loads of all of them in flight before the first is used, as qmatvec does.
// q, k and v rows form one sequence of row groups over the three matrices; gate and up rows go in pairs
// (the warp walks four gate rows, then the same four up rows, and multiplies them). Batches of more
// than 4 tokens take further passes over W.
// Requirements the launcher checks: cols % 256 == 0 for the K-quants, % 32 otherwise; q_rows and kv_rows
// multiples of 4 (head_dim % 4 == 0); W of each type aligned as qmatvec.hip needs; x and g 16-byte aligned.
#define RF_QMATVEC_NO_ENTRIES
#include "qmatvec.hip"

namespace {
namespace fq {

using q8::XSlice;

enum WeightType { kQ4_K = 0, kQ5_K = 1, kQ6_K = 2, kQ8_0 = 3, kQ4_0 = 4 };

constexpr int kMaxBatchPerPass = 4;

// The slice of x (times g when normalizing) quantized, and ss += x^2 over the slice's columns.
template <bool NORM>
static __device__ __forceinline__ XSlice quantize_xg(const float* __restrict__ x, const float* __restrict__ g, int col_a,
                                                     int col_b, float& ss) {
  float4 v[8];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[k] = *reinterpret_cast<const float4*>(x + col_a + 4 * k);
    v[4 + k] = *reinterpret_cast<const float4*>(x + col_b + 4 * k);
  }
  if (NORM) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float4 gk = *reinterpret_cast<const float4*>(g + (k < 4 ? col_a + 4 * k : col_b + 4 * (k - 4)));
      ss = fmaf(v[k].x, v[k].x, ss);
      ss = fmaf(v[k].y, v[k].y, ss);
      ss = fmaf(v[k].z, v[k].z, ss);
      ss = fmaf(v[k].w, v[k].w, ss);
      v[k] = {v[k].x * gk.x, v[k].y * gk.y, v[k].z * gk.z, v[k].w * gk.w};
    }
  }
  return q8::quantize_values(v);
}

// out[r][b] = the sum over the row of W row r0 + r times quantized (x * g)[b], in every lane; ss[b] =
// sum of x[b]^2 (when NORM). Rows past `rows` read row r0 again (their results are not to be written).
template <class Format, int NB, int ROWS, bool NORM>
__device__ __forceinline__ void rows_dot(const unsigned char* __restrict__ W, int rows, int r0,
                                         const float* __restrict__ x, const float* __restrict__ g, int cols,
                                         float out[ROWS][NB], float ss[NB]) {
  const int lane = (int)threadIdx.x % WARP_SIZE;
  const int slices = cols / 32;
  const unsigned long long row_bytes = Format::row_bytes(cols);
  const unsigned char* w[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) w[r] = W + (unsigned long long)(r0 + r < rows ? r0 + r : r0) * row_bytes;
  float acc[ROWS][NB], sq[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    sq[b] = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r][b] = 0.0f;
  }
  for (int slice = lane; slice < slices; slice += WARP_SIZE) {
    typename Format::Raw raw[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) raw[r] = Format::load(w[r], slice);
    int col_a, col_b;
    Format::columns(slice, col_a, col_b);
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const XSlice xs = quantize_xg<NORM>(x + (unsigned long long)b * cols, g, col_a, col_b, sq[b]);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) acc[r][b] = fmaf(xs.d, Format::dot(raw[r], slice, xs), acc[r][b]);
    }
  }
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    if (NORM) ss[b] = rf_warp_sum(sq[b]);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) out[r][b] = rf_warp_sum(acc[r][b]);
  }
}

// rows_dot for a matrix whose type is known only at run time (uniform across the warp).
template <int NB, int ROWS, bool NORM>
__device__ __forceinline__ void typed_rows_dot(int type, const unsigned char* W, int rows, int r0, const float* x,
                                               const float* g, int cols, float out[ROWS][NB], float ss[NB]) {
  switch (type) {
    case kQ4_K: rows_dot<q8::Q4_KFormat, NB, ROWS, NORM>(W, rows, r0, x, g, cols, out, ss); break;
    case kQ5_K: rows_dot<q8::Q5_KFormat, NB, ROWS, NORM>(W, rows, r0, x, g, cols, out, ss); break;
    case kQ6_K: rows_dot<q8::Q6_KFormat, NB, ROWS, NORM>(W, rows, r0, x, g, cols, out, ss); break;
    case kQ8_0: rows_dot<q8::Q8_0Format, NB, ROWS, NORM>(W, rows, r0, x, g, cols, out, ss); break;
    default: rows_dot<q8::Q4_0Format, NB, ROWS, NORM>(W, rows, r0, x, g, cols, out, ss); break;
  }
}

static __device__ __forceinline__ float norm_scale(float ss, int cols, float eps) {
  return 1.0f / sqrtf(ss / (float)cols + eps);
}

// rope.hip's sin/cos (Cody-Waite reduction, Cephes polynomials, as fused_matvec.hip copies it), so that
// the fused RoPE rotates exactly as the rope_f32 kernel does.
static __device__ __forceinline__ void rope_sincos(float angle, float* sin_out, float* cos_out) {
  const float k = rintf(angle * 0.636619772f);
  float r = fmaf(-k, 1.57079637050628662109375f, angle);
  r = fmaf(-k, -4.37113882867379e-08f, r);
  r = fmaf(-k, -1.71512451e-15f, r);
  const float z = r * r;
  const float s = fmaf(fmaf(fmaf(-1.9515295891e-4f, z, 8.3321608736e-3f), z, -1.6666654611e-1f), z * r, r);
  const float c = fmaf(fmaf(fmaf(fmaf(2.443315711809948e-5f, z, -1.388731625493765e-3f), z, 4.166664568298827e-2f), z,
                            -0.5f),
                       z, 1.0f);
  const int quadrant = (int)k & 3;
  const float s_q = (quadrant & 1) ? c : s;
  const float c_q = (quadrant & 1) ? s : c;
  *sin_out = (quadrant & 2) ? -s_q : s_q;
  *cos_out = ((quadrant + 1) & 2) ? -c_q : c_q;
}

struct Rope {
  const int* positions;
  const float* freq_factors;  // null: none
  int head_dim, rope_dim;
  float theta, freq_scale;
};

// Rows r, r + 1 (r even, one head) of token b rotated as rope_f32 rotates them (NORM mode).
static __device__ __forceinline__ void rotate(const Rope& p, int b, int r, float& s0, float& s1) {
  const int in_head = r % p.head_dim;
  if (in_head >= p.rope_dim) return;
  const float log2_step = -2.0f * log2f(p.theta) / (float)p.rope_dim;
  float freq = p.freq_scale * exp2f((float)(in_head / 2) * log2_step);
  if (p.freq_factors) freq = freq / p.freq_factors[in_head / 2];
  const float angle = (float)p.positions[b] * freq;
  float sn, cs;
  rope_sincos(angle, &sn, &cs);
  const float a = s0, c = s1;
  s0 = a * cs - c * sn;
  s1 = a * sn + c * cs;
}

template <int NB, int ROWS>
__device__ __forceinline__ void norm_rope_pass(float* const y[3], const unsigned char* const W[3], const int types[3],
                                               const int rows[3], const float* x, const float* g, const Rope& rope,
                                               int cols, float eps, int b0) {
  const int lane = (int)threadIdx.x % WARP_SIZE;
  const int warps_per_block = (int)blockDim.x / WARP_SIZE;
  const int first_group = (int)blockIdx.x * warps_per_block + (int)threadIdx.x / WARP_SIZE;
  const int group_stride = (int)gridDim.x * warps_per_block;
  const int groups0 = rows[0] / ROWS, groups1 = rows[1] / ROWS;
  const int groups = groups0 + groups1 + rows[2] / ROWS;
  for (int group = first_group; group < groups; group += group_stride) {  // uniform across the warp
    // The matrix as selects, not an index into the arrays, which would put them in local memory.
    const int m = group < groups0 ? 0 : group < groups0 + groups1 ? 1 : 2;
    const int r0 = ROWS * (group - (m == 0 ? 0 : m == 1 ? groups0 : groups0 + groups1));
    const unsigned char* Wm = m == 0 ? W[0] : m == 1 ? W[1] : W[2];
    const int type = m == 0 ? types[0] : m == 1 ? types[1] : types[2];
    const int rows_m = m == 0 ? rows[0] : rows[1];
    float* ym = m == 0 ? y[0] : m == 1 ? y[1] : y[2];
    float out[ROWS][NB], ss[NB];
    typed_rows_dot<NB, ROWS, true>(type, Wm, rows_m, r0, x, g, cols, out, ss);
    if (lane != 0) continue;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const float s = norm_scale(ss[b], cols, eps);
#pragma unroll
      for (int r = 0; r < ROWS; r += 2) {
        float s0 = out[r][b] * s, s1 = out[r + 1][b] * s;
        if (m < 2) rotate(rope, b0 + b, r0 + r, s0, s1);
        float* yb = ym + (unsigned long long)(b0 + b) * rows_m + r0 + r;
        yb[0] = s0;
        yb[1] = s1;
      }
    }
  }
}

template <int NB, int ROWS>
__device__ __forceinline__ void norm_swiglu_pass(float* y, const unsigned char* Wg, const unsigned char* Wu, int types,
                                                 const float* x, const float* g, int rows, int cols, float eps, int b0) {
  const int lane = (int)threadIdx.x % WARP_SIZE;
  const int warps_per_block = (int)blockDim.x / WARP_SIZE;
  const int first_group = (int)blockIdx.x * warps_per_block + (int)threadIdx.x / WARP_SIZE;
  const int group_stride = (int)gridDim.x * warps_per_block;
  const int groups = (rows + ROWS - 1) / ROWS;
  for (int group = first_group; group < groups; group += group_stride) {
    const int r0 = ROWS * group;
    float gate[ROWS][NB], up[ROWS][NB], ss[NB];
    typed_rows_dot<NB, ROWS, true>(types & 15, Wg, rows, r0, x, g, cols, gate, ss);
    typed_rows_dot<NB, ROWS, true>((types >> 4) & 15, Wu, rows, r0, x, g, cols, up, ss);
    if (lane != 0) continue;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const float s = norm_scale(ss[b], cols, eps);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const float a = gate[r][b] * s, u = up[r][b] * s;
        if (r0 + r < rows) y[(unsigned long long)(b0 + b) * rows + r0 + r] = a / (1.0f + expf(-a)) * u;
      }
    }
  }
}

// y = n @ W^T (NORM: the head) or y += x @ W^T (the residual add).
template <int NB, int ROWS, bool NORM>
__device__ __forceinline__ void single_pass(float* y, const unsigned char* W, int type, const float* x, const float* g,
                                            int rows, int cols, float eps, int b0) {
  const int lane = (int)threadIdx.x % WARP_SIZE;
  const int warps_per_block = (int)blockDim.x / WARP_SIZE;
  const int first_group = (int)blockIdx.x * warps_per_block + (int)threadIdx.x / WARP_SIZE;
  const int group_stride = (int)gridDim.x * warps_per_block;
  const int groups = (rows + ROWS - 1) / ROWS;
  for (int group = first_group; group < groups; group += group_stride) {
    const int r0 = ROWS * group;
    float out[ROWS][NB], ss[NB];
    typed_rows_dot<NB, ROWS, NORM>(type, W, rows, r0, x, g, cols, out, ss);
    if (lane != 0) continue;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const float s = NORM ? norm_scale(ss[b], cols, eps) : 1.0f;
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        if (r0 + r >= rows) continue;
        float* yr = y + (unsigned long long)(b0 + b) * rows + r0 + r;
        *yr = NORM ? out[r][b] * s : *yr + out[r][b];
      }
    }
  }
}

// pass.template run<NB, ROWS>(b0) for each pass of at most kMaxBatchPerPass tokens. Single-token steps
// have entries of their own (ONE_TOKEN): a kernel's registers are those of its widest path, and the
// batched passes (four tokens' accumulators) would cost the single-token pass half its occupancy (188
// registers against ~100 on sm_90, ptxas -v).
template <bool ONE_TOKEN, class Pass>
__device__ __forceinline__ void passes(int batch, const Pass& pass) {
  rf_check_wave_size();
  for (int b0 = 0; b0 < batch; b0 += kMaxBatchPerPass) {
    const int left = batch - b0;
    if (ONE_TOKEN) {
      pass.template run<1, 4>(b0);
      continue;
    }
    switch (left < kMaxBatchPerPass ? left : kMaxBatchPerPass) {
      case 1: pass.template run<1, 2>(b0); break;
      case 2: pass.template run<2, 2>(b0); break;
      case 3: pass.template run<3, 2>(b0); break;
      default: pass.template run<4, 2>(b0); break;
    }
  }
}

// The passes' functors (not lambdas: nvrtc compiles no lambda in device code without -default-device).
struct RopePass {
  float* const* y;
  const unsigned char* const* W;
  const int *type_of, *rows;
  const float *x, *g;
  const Rope* rope;
  int cols;
  float eps;
  template <int NB, int ROWS>
  __device__ __forceinline__ void run(int b0) const {
    norm_rope_pass<NB, ROWS>(y, W, type_of, rows, x + (unsigned long long)b0 * cols, g, *rope, cols, eps, b0);
  }
};

struct SwigluPass {
  float* y;
  const void *Wg, *Wu;
  const float *x, *g;
  int types, rows, cols;
  float eps;
  template <int NB, int ROWS>
  __device__ __forceinline__ void run(int b0) const {
    norm_swiglu_pass<NB, ROWS>(y, static_cast<const unsigned char*>(Wg), static_cast<const unsigned char*>(Wu), types,
                               x + (unsigned long long)b0 * cols, g, rows, cols, eps, b0);
  }
};

template <bool NORM>
struct SinglePass {
  float* y;
  const void* W;
  const float *x, *g;
  int type, rows, cols;
  float eps;
  template <int NB, int ROWS>
  __device__ __forceinline__ void run(int b0) const {
    single_pass<NB, ROWS, NORM>(y, static_cast<const unsigned char*>(W), type, x + (unsigned long long)b0 * cols, g,
                                rows, cols, eps, b0);
  }
};

template <bool ONE_TOKEN>
__device__ __forceinline__ void norm_rope(float* q, float* k, float* v, const void* Wq, const void* Wk, const void* Wv,
                                          const float* x, const float* g, const int* positions,
                                          const float* freq_factors, int types, int q_rows, int kv_rows, int cols,
                                          int batch, int head_dim, int rope_dim, float eps, float theta,
                                          float freq_scale) {
  float* const y[3] = {q, k, v};
  const unsigned char* const W[3] = {static_cast<const unsigned char*>(Wq), static_cast<const unsigned char*>(Wk),
                                     static_cast<const unsigned char*>(Wv)};
  const int type_of[3] = {types & 15, (types >> 4) & 15, (types >> 8) & 15};
  const int rows[3] = {q_rows, kv_rows, kv_rows};
  const Rope rope = {positions, freq_factors, head_dim, rope_dim, theta, freq_scale};
  passes<ONE_TOKEN>(batch, RopePass{y, W, type_of, rows, x, g, &rope, cols, eps});
}

template <bool ONE_TOKEN>
__device__ __forceinline__ void norm_swiglu(float* y, const void* Wg, const void* Wu, const float* x, const float* g,
                                            int types, int rows, int cols, int batch, float eps) {
  passes<ONE_TOKEN>(batch, SwigluPass{y, Wg, Wu, x, g, types, rows, cols, eps});
}

template <bool ONE_TOKEN, bool NORM>
__device__ __forceinline__ void single(float* y, const void* W, const float* x, const float* g, int type, int rows,
                                       int cols, int batch, float eps) {
  passes<ONE_TOKEN>(batch, SinglePass<NORM>{y, W, x, g, type, rows, cols, eps});
}

}  // namespace fq
}  // namespace

// Entries: <name>_1 for one token, <name>_n for any number (passes of up to four).
#define RF_FUSED_QMATVEC_ENTRIES(suffix, ONE_TOKEN)                                                                   \
  extern "C" __global__ __launch_bounds__(256) void qmatvec_norm_rope_##suffix(                                      \
      float* q, float* k, float* v, const void* Wq, const void* Wk, const void* Wv, const float* x, const float* g,   \
      const int* positions, const float* freq_factors, int types, int q_rows, int kv_rows, int cols, int batch,       \
      int head_dim, int rope_dim, float eps, float theta, float freq_scale) {                                         \
    fq::norm_rope<ONE_TOKEN>(q, k, v, Wq, Wk, Wv, x, g, positions, freq_factors, types, q_rows, kv_rows, cols, batch, \
                             head_dim, rope_dim, eps, theta, freq_scale);                                             \
  }                                                                                                                   \
  extern "C" __global__ __launch_bounds__(256) void qmatvec_norm_swiglu_##suffix(                                    \
      float* y, const void* Wg, const void* Wu, const float* x, const float* g, int types, int rows, int cols,        \
      int batch, float eps) {                                                                                         \
    fq::norm_swiglu<ONE_TOKEN>(y, Wg, Wu, x, g, types, rows, cols, batch, eps);                                       \
  }                                                                                                                   \
  extern "C" __global__ __launch_bounds__(256) void qmatvec_add_##suffix(float* y, const void* W, const float* x,    \
                                                                         int type, int rows, int cols, int batch) {   \
    fq::single<ONE_TOKEN, false>(y, W, x, nullptr, type, rows, cols, batch, 0.0f);                                    \
  }                                                                                                                   \
  extern "C" __global__ __launch_bounds__(256) void qmatvec_norm_##suffix(                                           \
      float* y, const void* W, const float* x, const float* g, int type, int rows, int cols, int batch, float eps) {  \
    fq::single<ONE_TOKEN, true>(y, W, x, g, type, rows, cols, batch, eps);                                            \
  }

RF_FUSED_QMATVEC_ENTRIES(1, true)
RF_FUSED_QMATVEC_ENTRIES(n, false)
