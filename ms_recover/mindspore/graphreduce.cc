// ms_recover's in-graph gradient reduction: a MindSpore CPU "aot" custom op.
//
// MsrReduce(slot, g_1 .. g_k) -> token (one float32), every g_i float32.
// The op reduces the k gradient buffers IN PLACE: it hands the slot's callback (a ctypes
// function that runs the Python reduction, bucket by bucket) the address and length of each
// input (read with msr_inputs, when they are new), the callback writes the reduced values back
// into those same buffers, and the op's only output is a token the optimizer is made to depend
// on. No copy of the gradients into a flat buffer and back, no output buffers to allocate: a
// gradient as large as a bucket is reduced where the backward pass left it.
// Small gradients are gathered into the slot's staging buffers (msr_plan: where each one goes)
// here, before the callback, and scattered back only if the callback succeeded on every bucket:
// a memcpy here costs far less than numpy slicing in the callback, and a failed reduction
// leaves those gradients as the backward pass wrote them. The callback is told whether it got
// the same buffers as on the previous call (a graph keeps its buffers between steps), so it
// can reuse its views of them, and whether the op staged the small gradients itself (not when
// two inputs overlap: the callback then stages every bucket, so nothing is reduced twice).
// A nonzero return makes MindSpore abort the graph before anything after this op ran (the
// optimizer consumes the gradients through the token); the Python side then rebuilds the
// graph (MindSpore latches the failure in the old one).
//
// The callback runs with the floating-point environment (MXCSR) of the thread that
// registered the slot: MindSpore's kernel threads may have flush-to-zero set, and the
// reduction must give the same bits as when Python calls it on its own thread.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>
#include <xmmintrin.h>

extern "C" {

// flags: bit 0, the same buffers (addresses and sizes) as on the slot's previous call;
// bit 1, the op gathered the small gradients into the staging buffers of msr_plan. The
// callback's only argument: ctypes builds a Python object for each argument on every call
// (a pointer argument is a ctypes instance), so the buffers' addresses and sizes, needed
// only when they are new, are read with msr_inputs instead.
typedef int (*msr_callback)(int64_t flags);

static const int64_t kMsrSame = 1;
static const int64_t kMsrStaged = 2;

struct MsrSlot {
  msr_callback cb;
  int64_t k;  // gradients the op must be given
  int64_t n;  // their total element count
  unsigned int mxcsr;
  std::vector<int64_t> plan_sizes;  // msr_plan: each gradient's element count
  std::vector<float *> stage;       // msr_plan: where each one is staged (null: in place)
  std::vector<void *> last_ptrs;    // the previous call's buffers
  std::vector<int64_t> last_sizes;
  bool overlap;  // whether two of last_ptrs' buffers overlap
};

static const int64_t kMsrSlots = 256;
static const int kMsrMaxInputs = 4096;
static MsrSlot g_msr_slots[kMsrSlots];

int msr_slots() { return static_cast<int>(kMsrSlots); }

int msr_register(int64_t slot, msr_callback cb, int64_t k, int64_t n) {
  if (slot < 0 || slot >= kMsrSlots || k < 0 || k > kMsrMaxInputs) return 1;
  MsrSlot &s = g_msr_slots[slot];
  s.cb = cb;
  s.k = k;
  s.n = n;
  s.mxcsr = _mm_getcsr();
  s.plan_sizes.clear();
  s.stage.clear();
  s.last_ptrs.clear();
  s.last_sizes.clear();
  s.overlap = false;
  return 0;
}

// Where the op stages each of the slot's k gradients: stage[i] is a buffer of sizes[i] floats
// (owned by the caller, alive until the slot is registered again), or null for a gradient
// the callback reduces where it lies. Without a plan the op stages nothing.
int msr_plan(int64_t slot, int64_t k, const int64_t *sizes, float *const *stage) {
  if (slot < 0 || slot >= kMsrSlots || k != g_msr_slots[slot].k) return 1;
  MsrSlot &s = g_msr_slots[slot];
  s.plan_sizes.assign(sizes, sizes + k);
  s.stage.assign(stage, stage + k);
  return 0;
}

// The buffers (addresses and element counts) of the slot's last call, for its callback: k
// entries each. Returns 1 if k is not the slot's count or the op has not run on it yet.
int msr_inputs(int64_t slot, int64_t k, void **ptrs, int64_t *sizes) {
  if (slot < 0 || slot >= kMsrSlots) return 1;
  const MsrSlot &s = g_msr_slots[slot];
  if (k != s.k || static_cast<int64_t>(s.last_ptrs.size()) != k) return 1;
  std::copy(s.last_ptrs.begin(), s.last_ptrs.end(), ptrs);
  std::copy(s.last_sizes.begin(), s.last_sizes.end(), sizes);
  return 0;
}

static int64_t msr_numel(int nd, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < nd; ++i) n *= shape[i];
  return n;
}

static bool msr_overlap(const std::vector<void *> &ptrs, const std::vector<int64_t> &sizes) {
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    if (sizes[i] == 0) continue;
    const uintptr_t lo = reinterpret_cast<uintptr_t>(ptrs[i]);
    spans.emplace_back(lo, lo + static_cast<uintptr_t>(sizes[i]) * sizeof(float));
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) return true;
  }
  return false;
}

// Return codes: 0 ok; 2 unknown slot; 3 the inputs are not the registered gradients (count or
// sizes); 4 not float32; 5 the callback failed (the Python side holds the exception).
static int msr_reduce(int nparam, void **params, int *ndims, int64_t **shapes,
                      const char **dtypes) {
  const int k = nparam - 2;  // params: slot, g_1 .. g_k, token
  if (k < 1 || k > kMsrMaxInputs) return 3;
  const int64_t slot = *static_cast<const int64_t *>(params[0]);
  if (slot < 0 || slot >= kMsrSlots || g_msr_slots[slot].cb == nullptr) return 2;
  MsrSlot &s = g_msr_slots[slot];
  if (k != s.k) return 3;
  for (int i = 1; i < nparam; ++i) {
    if (std::strcmp(dtypes[i], "float32") != 0) return 4;
  }
  std::vector<void *> ptrs(static_cast<size_t>(k));
  std::vector<int64_t> sizes(static_cast<size_t>(k));
  int64_t total = 0;
  for (int i = 0; i < k; ++i) {
    ptrs[i] = params[1 + i];
    sizes[i] = msr_numel(ndims[1 + i], shapes[1 + i]);
    total += sizes[i];
  }
  if (total != s.n) return 3;
  const bool planned = !s.stage.empty();
  if (planned && sizes != s.plan_sizes) return 3;  // a staging buffer would overflow
  int64_t flags = 0;
  if (ptrs == s.last_ptrs && sizes == s.last_sizes) {
    flags |= kMsrSame;
  } else {
    s.overlap = msr_overlap(ptrs, sizes);
    s.last_ptrs = ptrs;
    s.last_sizes = sizes;
  }
  const bool staged = planned && !s.overlap;
  if (staged) {
    flags |= kMsrStaged;
    for (int i = 0; i < k; ++i) {
      if (s.stage[i] != nullptr) std::memcpy(s.stage[i], ptrs[i], sizes[i] * sizeof(float));
    }
  }
  const unsigned int saved = _mm_getcsr();
  _mm_setcsr(s.mxcsr);
  const int rc = s.cb(flags);  // the buffers: s.last_ptrs, s.last_sizes (msr_inputs)
  _mm_setcsr(saved);
  if (rc != 0) return 5;  // the staged gradients stay as the backward pass wrote them
  if (staged) {
    for (int i = 0; i < k; ++i) {
      if (s.stage[i] != nullptr) std::memcpy(ptrs[i], s.stage[i], sizes[i] * sizeof(float));
    }
  }
  return 0;
}

// Token 0; a failure of any kind fails the op, and MindSpore aborts the graph.
int MsrReduce(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
              void *stream, void *extra) {
  (void)stream;
  (void)extra;
  const int rc = msr_reduce(nparam, params, ndims, shapes, dtypes);
  if (rc == 0) *static_cast<float *>(params[nparam - 1]) = 0.0f;
  return rc;
}

// The same, but a failed callback (the reduction raised) does not fail the op: the token is 1
// and the graph skips the optimizer (GraphStep's on_failure="skip"). MindSpore waits a fixed
// 3 s before it reports a failed kernel, and the graph must then be compiled again.
int MsrReduceFlag(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                  void *stream, void *extra) {
  (void)stream;
  (void)extra;
  const int rc = msr_reduce(nparam, params, ndims, shapes, dtypes);
  if (rc != 0 && rc != 5) return rc;
  *static_cast<float *>(params[nparam - 1]) = rc == 5 ? 1.0f : 0.0f;
  return 0;
}

// MsrNoop(slot, g_1 .. g_k) -> token: the same op with an empty body (no callback, nothing
// reduced). `bench overhead` measures it as the floor: what any in-graph op costs the step.
int MsrNoop(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
            void *stream, void *extra) {
  (void)ndims;
  (void)shapes;
  (void)dtypes;
  (void)stream;
  (void)extra;
  if (nparam < 2) return 3;
  *static_cast<float *>(params[nparam - 1]) = 0.0f;
  return 0;
}

}  // extern "C"
