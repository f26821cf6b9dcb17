// ms_recover's in-graph gradient reduction: a MindSpore CPU "aot" custom op.
//
// MsrReduce(slot, g_1 .. g_k) -> token (one float32), every g_i float32.
// The op reduces the k gradient buffers IN PLACE: it hands the slot's callback (a ctypes
// function that runs the Python reduction, bucket by bucket) the address and length of each
// input, the callback writes the reduced values back into those same buffers, and the op's
// only output is a token the optimizer is made to depend on. No copy of the gradients into a
// flat buffer and back, no output buffers to allocate: a gradient as large as a bucket is
// reduced where the backward pass left it.
// A nonzero return makes MindSpore abort the graph before anything after this op ran (the
// optimizer consumes the gradients through the token); the Python side then rebuilds the
// graph (MindSpore latches the failure in the old one).
//
// The callback runs with the floating-point environment (MXCSR) of the thread that
// registered the slot: MindSpore's kernel threads may have flush-to-zero set, and the
// reduction must give the same bits as when Python calls it on its own thread.
#include <cstdint>
#include <cstring>
#include <vector>
#include <xmmintrin.h>

extern "C" {

typedef int (*msr_callback)(int64_t slot, int64_t k, void *const *ptrs, const int64_t *sizes);

struct MsrSlot {
  msr_callback cb;
  int64_t k;  // gradients the op must be given
  int64_t n;  // their total element count
  unsigned int mxcsr;
};

static const int64_t kMsrSlots = 256;
static const int kMsrMaxInputs = 4096;
static MsrSlot g_msr_slots[kMsrSlots];

int msr_slots() { return static_cast<int>(kMsrSlots); }

int msr_register(int64_t slot, msr_callback cb, int64_t k, int64_t n) {
  if (slot < 0 || slot >= kMsrSlots || k < 0 || k > kMsrMaxInputs) return 1;
  g_msr_slots[slot].cb = cb;
  g_msr_slots[slot].k = k;
  g_msr_slots[slot].n = n;
  g_msr_slots[slot].mxcsr = _mm_getcsr();
  return 0;
}

static int64_t msr_numel(int nd, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < nd; ++i) n *= shape[i];
  return n;
}

// Return codes: 0 ok; 2 unknown slot; 3 the inputs are not the registered gradients (count or
// total size); 4 not float32; 5 the callback failed (the Python side holds the exception).
static int msr_reduce(int nparam, void **params, int *ndims, int64_t **shapes,
                      const char **dtypes) {
  const int k = nparam - 2;  // params: slot, g_1 .. g_k, token
  if (k < 1 || k > kMsrMaxInputs) return 3;
  const int64_t slot = *static_cast<const int64_t *>(params[0]);
  if (slot < 0 || slot >= kMsrSlots || g_msr_slots[slot].cb == nullptr) return 2;
  const MsrSlot &s = g_msr_slots[slot];
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
  const unsigned int saved = _mm_getcsr();
  _mm_setcsr(s.mxcsr);
  const int rc = s.cb(slot, k, ptrs.data(), sizes.data());
  _mm_setcsr(saved);
  return rc == 0 ? 0 : 5;
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
