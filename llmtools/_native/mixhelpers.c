/* Index builders for llm-mix, loaded with ctypes (no Python or numpy headers needed).
 *
 * They compute the same arrays as Megatron-LM's helpers.cpp (build_blending_indices and
 * build_sample_idx), written from the algorithm's description, not from its code. The floating
 * point expression of the greedy blend is evaluated in the same order and precision as Megatron's
 * (double, no fused multiply-add: build with -ffp-contract=off), so ties break identically.
 *
 * Built by `pip install` (setup.py) or, failing that, on first use into a per-user cache.
 * When built as a CPython extension module the tiny PyInit function below only makes it importable
 * so that its file can be found; the functions are called through ctypes either way.
 */
#include <stdint.h>
#include <string.h>

#if defined(_WIN32)
#define LLM_EXPORT __declspec(dllexport)
#else
#define LLM_EXPORT __attribute__((visibility("default")))
#endif

LLM_EXPORT int32_t llm_abi_version(void) { return 5; }

/* Greedy blend: sample t goes to the source i with the largest w[i]*max(t,1) - counts[i];
 * strict '>' so ties go to the lowest index. `counts` (n entries) must be zeroed by the caller and
 * holds the per-source sample counts afterwards.
 *
 * `continued` (a compile-time constant once inlined, so the fresh blend pays nothing for it): a blend
 * that continues earlier draws writes part_of[i] instead of i and offsets[i] + counts[i] instead of
 * counts[i]; the choice itself, which only looks at this blend's own counts, is unchanged. */
static inline void blend(const double *weights, int32_t n, int64_t size, const int16_t *part_of,
                         const int64_t *offsets, int16_t *dataset_index, int64_t *dataset_sample_index,
                         int64_t *counts, const int continued) {
    if (n == 2) { /* the common case, unrolled: same expressions, same order */
        const double w0 = weights[0], w1 = weights[1];
        const int16_t q0 = continued ? part_of[0] : 0, q1 = continued ? part_of[1] : 1;
        const int64_t o0 = continued ? offsets[0] : 0, o1 = continued ? offsets[1] : 0;
        int64_t c0 = counts[0], c1 = counts[1];
        for (int64_t t = 0; t < size; ++t) {
            const double x = t > 1 ? (double)t : 1.0;
            const double e0 = w0 * x - (double)c0;
            const double e1 = w1 * x - (double)c1;
            /* branch-free: the choice is data dependent and mispredicts ~30% of the time otherwise */
            const int64_t pick = e1 > e0;
            dataset_index[t] = pick ? q1 : q0;
            dataset_sample_index[t] = pick ? c1 + o1 : c0 + o0;
            c0 += 1 - pick;
            c1 += pick;
        }
        counts[0] = c0;
        counts[1] = c1;
        return;
    }
    if (n == 3) { /* unrolled like n == 2; the comparisons in the generic loop's order */
        const double w0 = weights[0], w1 = weights[1], w2 = weights[2];
        const int16_t q0 = continued ? part_of[0] : 0, q1 = continued ? part_of[1] : 1;
        const int16_t q2 = continued ? part_of[2] : 2;
        const int64_t o0 = continued ? offsets[0] : 0, o1 = continued ? offsets[1] : 0;
        const int64_t o2 = continued ? offsets[2] : 0;
        int64_t c0 = counts[0], c1 = counts[1], c2 = counts[2];
        for (int64_t t = 0; t < size; ++t) {
            const double x = t > 1 ? (double)t : 1.0;
            const double e0 = w0 * x - (double)c0;
            const double e1 = w1 * x - (double)c1;
            const double e2 = w2 * x - (double)c2;
            const int64_t p1 = e1 > e0;
            const double best_error = p1 ? e1 : e0;
            const int64_t p2 = e2 > best_error;
            const int64_t pick = p2 ? 2 : p1;
            dataset_index[t] = pick == 2 ? q2 : (pick ? q1 : q0);
            dataset_sample_index[t] = pick == 2 ? c2 + o2 : (pick ? c1 + o1 : c0 + o0);
            c0 += pick == 0;
            c1 += pick == 1;
            c2 += pick == 2;
        }
        counts[0] = c0;
        counts[1] = c1;
        counts[2] = c2;
        return;
    }
    for (int64_t t = 0; t < size; ++t) {
        const double x = t > 1 ? (double)t : 1.0;
        int32_t best = 0;
        double best_error = weights[0] * x - (double)counts[0];
        for (int32_t i = 1; i < n; ++i) {
            const double error = weights[i] * x - (double)counts[i];
            if (error > best_error) {
                best_error = error;
                best = i;
            }
        }
        dataset_index[t] = continued ? part_of[best] : (int16_t)best;
        dataset_sample_index[t] = continued ? offsets[best] + counts[best] : counts[best];
        counts[best]++;
    }
}

LLM_EXPORT void llm_blend_indices(const double *weights, int32_t n, int64_t size, int16_t *dataset_index,
                                  int64_t *dataset_sample_index, int64_t *counts) {
    blend(weights, n, size, 0, 0, dataset_index, dataset_sample_index, counts, 0);
}

/* The same greedy for a blend that continues earlier draws (see blend()). */
LLM_EXPORT void llm_blend_indices_continued(const double *weights, int32_t n, int64_t size,
                                            const int16_t *part_of, const int64_t *offsets,
                                            int16_t *dataset_index, int64_t *dataset_sample_index,
                                            int64_t *counts) {
    blend(weights, n, size, part_of, offsets, dataset_index, dataset_sample_index, counts, 1);
}

/* GPT sample index: row k = (position in document_index, token offset) where sample k starts.
 * Sample k covers the flattened token positions [k*seq, k*seq + seq + extra) of the documents taken
 * in document_index order; a document boundary exactly at the end of a sample leaves the next start
 * on that document's last token (consecutive samples share one token). Writes num_samples + 1 rows;
 * returns -1 when the documents run out before (the caller sized num_samples wrongly). */
LLM_EXPORT int64_t llm_sample_idx(const int32_t *sizes, const int32_t *document_index, int64_t n_documents,
                                  int32_t seq_length, int64_t num_samples, int32_t extra, int64_t *out) {
    int64_t doc = 0, offset = 0;
    out[0] = 0;
    out[1] = 0;
    for (int64_t k = 1; k <= num_samples; ++k) {
        int64_t remaining = (int64_t)seq_length + extra;
        while (remaining != 0) {
            const int64_t length = (int64_t)sizes[document_index[doc]] - offset;
            remaining -= length;
            if (remaining <= 0) {
                offset += remaining + length - extra;
                remaining = 0;
            } else {
                if (doc == n_documents - 1) {
                    if (k != num_samples) return -1;
                    offset = (int64_t)sizes[document_index[doc]] - extra;
                    break;
                }
                ++doc;
                offset = 0;
            }
        }
        out[2 * k] = doc;
        out[2 * k + 1] = offset;
    }
    return num_samples;
}

/* Copy whole samples of one source into rows of `out` (int64, `width` = seq_length + 1 per row).
 * bounds holds 4 int64 per sample: (b, bo, e, eo) = the sample-index rows k and k + 1, i.e. start at
 * document-index position b offset bo, end at position e offset eo inclusive (Megatron's extra token).
 * dtype_kind: 2 = uint16, 4 = int32 (the token dtypes Megatron writes). Returns the first row whose
 * runs do not add up to `width` (a corrupt index), or -1 when all is well. */
LLM_EXPORT int64_t llm_gather_samples(const uint8_t *bin, int32_t dtype_kind, const int64_t *pointers,
                                      const int32_t *lengths, const int32_t *document_index, const int64_t *bounds,
                                      int64_t n, int64_t width, const int64_t *rows, int64_t *out) {
    for (int64_t r = 0; r < n; ++r) {
        const int64_t b = bounds[4 * r], bo = bounds[4 * r + 1], e = bounds[4 * r + 2], eo = bounds[4 * r + 3];
        int64_t *dst = out + rows[r] * width;
        int64_t pos = 0;
        for (int64_t x = b; x <= e; ++x) {
            const int64_t seq = document_index[x];
            const int64_t off = x == b ? bo : 0;
            const int64_t len = x == e ? eo + 1 - off : (int64_t)lengths[seq] - off;
            if (len < 0 || pos + len > width) return r;
            if (dtype_kind == 2) {
                const uint16_t *src = (const uint16_t *)(bin + pointers[seq]) + off;
                for (int64_t j = 0; j < len; ++j) dst[pos + j] = src[j];
            } else {
                const int32_t *src = (const int32_t *)(bin + pointers[seq]) + off;
                for (int64_t j = 0; j < len; ++j) dst[pos + j] = src[j];
            }
            pos += len;
        }
        if (pos != width) return r;
    }
    return -1;
}

/* An MMIDIDX index against itself and its .bin, in one pass: every length >= 0, every pointer the running
 * byte offset of the lengths before it (from 0), the last sequence ending exactly at bin_size, document
 * indices never going back (their first and last values are checked by the caller). Returns -1 when all
 * holds, else the position of the first problem (the caller's numpy check then says what it is).
 * The arrays lie in the .idx at offsets that are not multiples of their width: read through memcpy. */
LLM_EXPORT int64_t llm_check_index(const int32_t *lengths, const int64_t *pointers, int64_t s, int64_t itemsize,
                                   int64_t bin_size, const int64_t *docs, int64_t d) {
    const char *lp = (const char *)lengths, *pp = (const char *)pointers, *dp = (const char *)docs;
    int64_t running = 0;
    for (int64_t i = 0; i < s; ++i) {
        int32_t len;
        int64_t pointer;
        memcpy(&len, lp + 4 * i, 4);
        memcpy(&pointer, pp + 8 * i, 8);
        if (len < 0 || pointer != running) return i;
        running += (int64_t)len * itemsize; /* no overflow: running <= bin_size before, len * itemsize < 2**34 */
        if (running > bin_size) return i;
    }
    if (running != bin_size) return s;
    int64_t previous = 0, doc;
    for (int64_t j = 0; j < d; ++j) {
        memcpy(&doc, dp + 8 * j, 8);
        if (j > 0 && doc < previous) return s + j;
        previous = doc;
    }
    return -1;
}

#ifdef LLM_PYTHON_MODULE
#include <Python.h>
static struct PyModuleDef llm_module = {PyModuleDef_HEAD_INIT, "_helpers",
                                        "ctypes-loaded helpers of llmtools", -1, NULL};
PyMODINIT_FUNC PyInit__helpers(void) { return PyModule_Create(&llm_module); }
#endif
