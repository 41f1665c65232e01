// The batched sampler's CUDA kernel (sampler.h gives the math, the method and its invariant).
//
// logits: (rows, ld) T row-major, V valid columns; grid rows, one block of kThreads per row; every pass reads the
// row from global memory (L2-resident for the decode batch) with the thread → element map j = tid + i · kThreads,
// except the draw's and the logprobs' scans, which give each thread one contiguous chunk of ids so that a block
// scan of the chunks' sums orders them by id. Integer masses and counts make every histogram and sum independent
// of the order of the shared-memory atomics, so a row's token is a pure function of its inputs and (seed, row, step).
#include <climits>
#include <type_traits>

#include "tessera/core/cuda_util.cuh"
#include "tessera/infer/sampler.h"
#include "tessera/infer/sampler_math.h"

namespace tessera {
namespace {

using cuda::from_f32;
using cuda::to_f32;
using namespace sampling;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

struct SampleShared {
  unsigned long long hist[256];
  unsigned long long warp_u64[kWarps];
  float warp_f[kWarps];
  int warp_i[kWarps];
  uint32_t prefix;
  unsigned long long rem;
  unsigned long long total;
  int token;
  int cand[SampleParams::kMaxLogprobs];
};

// The exclusive prefix of v over threads in order of threadIdx.x; *total gets Σ v.
__device__ unsigned long long block_exclusive_scan_u64(unsigned long long v, SampleShared& s,
                                                       unsigned long long* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned long long incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long u = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += u;
  }
  __syncthreads();
  if (lane == 31) s.warp_u64[warp] = incl;
  __syncthreads();
  unsigned long long before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += s.warp_u64[w];
    all += s.warp_u64[w];
  }
  *total = all;
  return before + incl - v;
}

// Σ v over the block in a fixed order (the map of elements to threads is fixed, so the sum is reproducible).
__device__ float block_sum_f32(float v, SampleShared& s) {
  v = cuda::warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s.warp_f[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.0f;
  for (int w = 0; w < kWarps; ++w) t += s.warp_f[w];
  return t;
}

// Steps 1-2 in place: penalties from the row's counts, then the bias list (distinct ids, so no two threads write
// one element). __syncthreads makes the block's global writes visible to its later passes.
template <typename T>
__device__ void process_row(const SampleParams& p, T* row, const int32_t* counts, const int32_t* bias_ids,
                            const float* bias_values) {
  if (p.penalized()) {
    for (int j = threadIdx.x; j < p.V; j += kThreads)
      row[j] = from_f32<T>(
          penalize(to_f32(row[j]), counts[j], p.repetition_penalty, p.presence_penalty, p.frequency_penalty));
    __syncthreads();
  }
  if (p.n_bias > 0) {
    for (int b = threadIdx.x; b < p.n_bias; b += kThreads) {
      const int id = bias_ids[b];
      if (id >= 0 && id < p.V) row[id] = from_f32<T>(add_rn(to_f32(row[id]), bias_values[b]));
    }
    __syncthreads();
  }
}

// The row's max and argmax (lowest id on a tie), and whether any logit is NaN or +inf; the same on every thread.
template <typename T>
__device__ void row_max(const T* row, int V, SampleShared& s, float* mx_out, int* arg_out, bool* bad_out) {
  float mx = -INFINITY;
  int arg = INT_MAX, bad = 0;
  for (int j = threadIdx.x; j < V; j += kThreads) {
    const float x = to_f32(row[j]);
    if (isnan(x) || x == INFINITY) bad = 1;
    if (x > mx) mx = x, arg = j;  // ascending j per thread: strictly greater keeps the lowest id
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(kFull, mx, o);
    const int a2 = __shfl_xor_sync(kFull, arg, o);
    if (m2 > mx || (m2 == mx && a2 < arg)) mx = m2, arg = a2;
  }
  bad = __any_sync(kFull, bad);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    s.warp_f[threadIdx.x >> 5] = mx;
    s.warp_i[threadIdx.x >> 5] = arg;
    s.warp_u64[threadIdx.x >> 5] = bad;
  }
  __syncthreads();
  mx = -INFINITY, arg = INT_MAX, bad = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (s.warp_f[w] > mx || (s.warp_f[w] == mx && s.warp_i[w] < arg)) mx = s.warp_f[w], arg = s.warp_i[w];
    bad |= static_cast<int>(s.warp_u64[w]);
  }
  *mx_out = mx;
  *arg_out = arg;
  *bad_out = bad != 0;
}

// Radix descent over the order keys of the elements with key >= lo: returns the key P with
// weight(key > P) < r <= weight(key >= P), where weight counts elements (kMass false) or sums their masses, and
// r = target, or nucleus_mass(top_p, total weight) when from_total. Four passes of 8 bits, most significant first;
// after fixing the top bits to `prefix`, rem is what the elements with those top bits must still supply.
template <bool kMass, typename T>
__device__ uint32_t radix_descend(const T* row, int V, uint32_t lo, float mx, float temperature,
                                  unsigned long long target, bool from_total, float top_p, SampleShared& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t prefix = 0;
  unsigned long long rem = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    const uint32_t hi_mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
    __syncthreads();  // the previous pass's walk has read hist
    if (threadIdx.x < 256) s.hist[threadIdx.x] = 0;
    __syncthreads();
    for (int j = threadIdx.x; j < V; j += kThreads) {
      const float x = to_f32(row[j]);
      const uint32_t key = order_key(x);
      if (key < lo || (key & hi_mask) != prefix) continue;
      const unsigned long long add = kMass ? mass_of(weight(x, mx, temperature)) : 1ull;
      if (add) atomicAdd(&s.hist[(key >> shift) & 255u], add);
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l holds the bins of group g = 31 - l (bins 8g .. 8g + 7), so lanes run from the top bins down.
      const int g = 31 - lane;
      unsigned long long gs = 0;
      for (int i = 0; i < 8; ++i) gs += s.hist[8 * g + i];
      unsigned long long incl = gs;
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long u = __shfl_up_sync(kFull, incl, o);
        if (lane >= o) incl += u;
      }
      if (shift == 24 && from_total) rem = nucleus_mass(top_p, __shfl_sync(kFull, incl, 31));
      const unsigned hit = __ballot_sync(kFull, incl >= rem);
      const int L = hit ? __ffs(hit) - 1 : 31;  // the invariant gives hit != 0; 31 keeps a bad input in range
      if (lane == L) {
        unsigned long long above = incl - gs;
        int b = 8 * g + 7;
        for (; b > 8 * g; --b) {
          if (above + s.hist[b] >= rem) break;
          above += s.hist[b];
        }
        s.prefix = prefix | (static_cast<uint32_t>(b) << shift);
        s.rem = rem - above;
      }
    }
    __syncthreads();
    prefix = s.prefix;
    rem = s.rem;
  }
  return prefix;
}

// This thread's contiguous chunk of ids, [*begin, *end).
__device__ void chunk_of_thread(int V, int* begin, int* end) {
  const int c = (V + kThreads - 1) / kThreads;
  *begin = min(V, static_cast<int>(threadIdx.x) * c);
  *end = min(V, *begin + c);
}

// The top-N log-softmax values of l / t (sampler.h): the N-th largest key by a count descent, then the keys above
// it and the lowest ids at it, gathered in id order by two chunk scans, and sorted by thread 0 (N <= 20).
template <typename T>
__device__ void row_logprobs(const SampleParams& p, const T* row, float mx, int32_t* ids, float* values,
                             SampleShared& s) {
  const int V = p.V, N = p.logprobs, k = min(N, V);
  const float t = p.temperature > 0.0f ? p.temperature : 1.0f;
  float z = 0.0f;
  for (int j = threadIdx.x; j < V; j += kThreads) z += expf((to_f32(row[j]) - mx) / t);
  const float log_z = logf(block_sum_f32(z, s));
  const uint32_t cut = radix_descend</*kMass=*/false>(row, V, /*lo=*/0u, mx, t, /*target=*/k, /*from_total=*/false,
                                                      /*top_p=*/1.0f, s);
  int begin, end;
  chunk_of_thread(V, &begin, &end);
  unsigned long long gt = 0, eq = 0, total_gt, total_eq;
  for (int j = begin; j < end; ++j) {
    const uint32_t key = order_key(to_f32(row[j]));
    gt += key > cut;
    eq += key == cut;
  }
  unsigned long long r_gt = block_exclusive_scan_u64(gt, s, &total_gt);
  unsigned long long r_eq = block_exclusive_scan_u64(eq, s, &total_eq);
  const unsigned long long need_eq = static_cast<unsigned long long>(k) - total_gt;  // total_gt < k <= gt + eq
  for (int j = begin; j < end; ++j) {
    const uint32_t key = order_key(to_f32(row[j]));
    if (key > cut) s.cand[r_gt++] = j;
    else if (key == cut && r_eq < need_eq) s.cand[total_gt + r_eq++] = j;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < k; ++i) {  // insertion sort: larger logit first, then lower id
      const int c = s.cand[i];
      const float xc = to_f32(row[c]);
      int m = i;
      for (; m > 0; --m) {
        const float xm = to_f32(row[s.cand[m - 1]]);
        if (xm > xc || (xm == xc && s.cand[m - 1] < c)) break;
        s.cand[m] = s.cand[m - 1];
      }
      s.cand[m] = c;
    }
    for (int i = 0; i < N; ++i) {
      ids[i] = i < k ? s.cand[i] : -1;
      values[i] = i < k ? (to_f32(row[s.cand[i]]) - mx) / t - log_z : -INFINITY;
    }
  }
}

// Step 7: the first id whose inclusive prefix of kept mass exceeds the draw's target (on every thread).
template <typename T>
__device__ int draw_token(const SampleParams& p, const T* row, float mx, uint32_t cut, uint32_t u, SampleShared& s) {
  int begin, end;
  chunk_of_thread(p.V, &begin, &end);
  auto kept_mass = [&](int j) -> unsigned long long {
    const float x = to_f32(row[j]);
    if (order_key(x) < cut) return 0;
    const float w = weight(x, mx, p.temperature);
    return (p.min_p > 0.0f && !(w >= p.min_p)) ? 0 : mass_of(w);
  };
  unsigned long long mine = 0, z;
  for (int j = begin; j < end; ++j) mine += kept_mass(j);
  if (threadIdx.x == 0) s.token = -1;  // before the scan's barriers; replaced by the one thread that holds the target
  const unsigned long long before = block_exclusive_scan_u64(mine, s, &z);
  const unsigned long long target = draw_target(u, z);  // z >= 2^38: the maximum survives every filter
  if (before <= target && target < before + mine) {     // exactly one thread holds the target
    unsigned long long cum = before;
    for (int j = begin; j < end; ++j) {
      cum += kept_mass(j);
      if (cum > target) {
        s.token = j;
        break;
      }
    }
  }
  __syncthreads();
  return s.token;
}

// One block per row: steps 1-7 of sampler.h, then thread 0 writes the token, the next step and the count.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    sample_rows_radix(SampleParams p, int32_t* tokens, T* logits, int32_t* counts, const int32_t* bias_ids,
                      const float* bias_values, uint32_t* steps, int32_t* logprob_ids, float* logprob_values) {
  __shared__ SampleShared s;
  const int n = blockIdx.x;
  T* row = logits + static_cast<size_t>(n) * p.row_stride();
  int32_t* row_counts = counts ? counts + static_cast<size_t>(n) * p.V : nullptr;
  process_row(p, row, row_counts, bias_ids, bias_values);
  float mx;
  int arg;
  bool bad;
  row_max(row, p.V, s, &mx, &arg, &bad);
  if (bad || mx == -INFINITY) {  // uniform across the block: every thread read the same reduction
    if (threadIdx.x == 0) tokens[n] = -1;
    return;
  }
  if (p.logprobs > 0)
    row_logprobs(p, row, mx, logprob_ids + static_cast<size_t>(n) * p.logprobs,
                 logprob_values + static_cast<size_t>(n) * p.logprobs, s);
  const uint32_t step = steps[n];
  int token = arg;
  if (p.temperature > 0.0f) {
    uint32_t cut = 0;
    if (p.top_k > 0 && p.top_k < p.V)
      cut = radix_descend</*kMass=*/false>(row, p.V, /*lo=*/0u, mx, p.temperature,
                                           /*target=*/static_cast<unsigned long long>(p.top_k),
                                           /*from_total=*/false, /*top_p=*/1.0f, s);
    if (p.top_p < 1.0f)
      cut = radix_descend</*kMass=*/true>(row, p.V, /*lo=*/cut, mx, p.temperature, /*target=*/0ull,
                                          /*from_total=*/true, p.top_p, s);
    token = draw_token(p, row, mx, cut, draw_word(p.seed, n, step), s);
  }
  if (threadIdx.x == 0) {
    tokens[n] = token;
    steps[n] = step + 1;
    if (p.count_drawn && row_counts && token >= 0) row_counts[token] += 1;
  }
}

// counts[n, tokens[n, i]] += 1 for i < lengths[n]; grid rows, 256 threads; ids outside [0, V) are skipped.
__global__ void sampler_counts_add_rows(int V, int max_len, int32_t* counts, const int32_t* tokens,
                                        const int32_t* lengths) {
  const int n = blockIdx.x;
  const int len = min(max(lengths[n], 0), max_len);
  for (int i = threadIdx.x; i < len; i += blockDim.x) {
    const int32_t t = tokens[static_cast<size_t>(n) * max_len + i];
    if (t >= 0 && t < V) atomicAdd(&counts[static_cast<size_t>(n) * V + t], 1);
  }
}

}  // namespace

void sample_rows_cuda(const SampleParams& p, DType dtype, int32_t* tokens, void* logits, int32_t* counts,
                      const int32_t* bias_ids, const float* bias_values, uint32_t* steps, int32_t* logprob_ids,
                      float* logprob_values, Context& ctx) {
  if (p.rows == 0) return;
  const cudaStream_t st = ctx.stream();
  auto launch = [&](auto* typed) {
    using T = std::remove_pointer_t<decltype(typed)>;
    sample_rows_radix<T><<<p.rows, kThreads, 0, st>>>(p, tokens, static_cast<T*>(logits), counts, bias_ids, bias_values,
                                                      steps, logprob_ids, logprob_values);
  };
  if (dtype == DType::F32) launch(static_cast<float*>(nullptr));
  else if (dtype == DType::BF16) launch(static_cast<__nv_bfloat16*>(nullptr));
  else if (dtype == DType::F16) launch(static_cast<__half*>(nullptr));
  else TS_THROW("sample_rows: no CUDA kernel for dtype ", dtype_name(dtype));
  TS_CHECK_LAUNCH();
}

void sampler_counts_add_cuda(int rows, int V, int max_len, int32_t* counts, const int32_t* tokens,
                             const int32_t* lengths, Context& ctx) {
  if (rows == 0 || max_len == 0) return;
  const cudaStream_t st = ctx.stream();
  sampler_counts_add_rows<<<rows, 256, 0, st>>>(V, max_len, counts, tokens, lengths);
  TS_CHECK_LAUNCH();
}

}  // namespace tessera
