/* The sampling loops that run for every (state, step) of a SPOT round, in one pass each without K x V temporaries
 * (spot.runtime.noise and spot.runtime.gumbel_max; each has a numpy twin, and tests hold the two equal):
 *
 * bins_into(prefix_a uint32[K], V, bits, out uint16[K*V])
 *     out[k*V + v] = mix32(prefix_a[k] ^ v) >> (32 - bits): every token's lane-A word's top bits (docs/noise.md).
 * gumbel_at_into(prefix_a uint32[M], prefix_b uint32[M], tokens int64[M], out float64[M])
 *     the definition's Gumbel value of each (row prefixes, token): k = (a >> 5) * 2**26 + (b >> 6),
 *     u = max(k, 0.5) * 2**-53, g = -log(-log(u)) with the C library's log, as spot.runtime.noise computes it.
 * candidates_into(bins uint16[K*V], base float64[K*V], threshold float64[K], top int64[K], bounds float64[2**bits],
 *                 V, out int64[cap]) -> n
 *     the flat indices i = k*V + v (ascending) where bounds[bins[i]] + base[i] >= threshold[k] or v == top[k]:
 *     numpy's flatnonzero(bounds[bins] + base >= threshold[:, None]) with each row's top added; out holds the
 *     first min(n, cap).
 * Integer arithmetic, one IEEE float64 add and compare, and C library log calls: no compiler flag that keeps IEEE
 * semantics (this project never builds with fast-math) changes a result. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

static inline uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x21F0AAADu;
    x ^= x >> 15;
    x *= 0x735A2D97u;
    x ^= x >> 15;
    return x;
}

#define ITEMS(buf, type) ((buf).len / (Py_ssize_t)sizeof(type))

static PyObject *bins_into(PyObject *self, PyObject *args) {
    Py_buffer prefix, out;
    Py_ssize_t v;
    int bits;
    if (!PyArg_ParseTuple(args, "y*niw*", &prefix, &v, &bits, &out)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t rows = ITEMS(prefix, uint32_t);
    if (v <= 0 || bits < 1 || bits > 16 || ITEMS(out, uint16_t) != rows * v) {
        PyErr_Format(PyExc_ValueError, "got prefix %zd B, V %zd, bits %d, out %zd B; expected [K] uint32, V > 0, "
                     "bits in 1..16, [K*V] uint16", prefix.len, v, bits, out.len);
        goto done;
    }
    const uint32_t *p = (const uint32_t *)prefix.buf;
    uint16_t *o = (uint16_t *)out.buf;
    const int shift = 32 - bits;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < rows; k++)
        for (Py_ssize_t j = 0; j < v; j++) o[k * v + j] = (uint16_t)(mix32(p[k] ^ (uint32_t)j) >> shift);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&prefix);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *gumbel_at_into(PyObject *self, PyObject *args) {
    Py_buffer pa, pb, tokens, out;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &pa, &pb, &tokens, &out)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t m = ITEMS(tokens, int64_t);
    if (ITEMS(pa, uint32_t) != m || ITEMS(pb, uint32_t) != m || ITEMS(out, double) != m) {
        PyErr_Format(PyExc_ValueError, "got prefix_a %zd B, prefix_b %zd B, tokens %zd B, out %zd B; expected "
                     "[M] uint32, [M] uint32, [M] int64, [M] float64", pa.len, pb.len, tokens.len, out.len);
        goto done;
    }
    const uint32_t *a = (const uint32_t *)pa.buf, *b = (const uint32_t *)pb.buf;
    const int64_t *t = (const int64_t *)tokens.buf;
    double *o = (double *)out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < m; i++) {
        const uint32_t tok = (uint32_t)t[i];
        const uint64_t k = ((uint64_t)(mix32(a[i] ^ tok) >> 5) << 26) | (uint64_t)(mix32(b[i] ^ tok) >> 6);
        const double u = (k == 0 ? 0.5 : (double)k) * 0x1p-53;
        o[i] = -log(-log(u));
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&pa);
    PyBuffer_Release(&pb);
    PyBuffer_Release(&tokens);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *candidates_into(PyObject *self, PyObject *args) {
    Py_buffer bins, base, threshold, top, bounds, out;
    Py_ssize_t v;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*nw*", &bins, &base, &threshold, &top, &bounds, &v, &out)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n_elem = ITEMS(base, double), rows = ITEMS(threshold, double), cap = ITEMS(out, int64_t);
    Py_ssize_t n_bounds = ITEMS(bounds, double);
    if (v <= 0 || n_elem != rows * v || ITEMS(bins, uint16_t) != n_elem || ITEMS(top, int64_t) != rows ||
        n_bounds < 1 || n_bounds > 65536 || (n_bounds & (n_bounds - 1)) != 0) {
        PyErr_Format(PyExc_ValueError, "got bins %zd B, base %zd B, threshold %zd B, top %zd B, bounds %zd B, V %zd; "
                     "expected [K*V] uint16, [K*V] float64, [K] float64, [K] int64, [2**bits] float64",
                     bins.len, base.len, threshold.len, top.len, bounds.len, v);
        goto done;
    }
    const uint16_t *bn = (const uint16_t *)bins.buf;
    const double *x = (const double *)base.buf, *th = (const double *)threshold.buf, *g = (const double *)bounds.buf;
    const int64_t *best = (const int64_t *)top.buf;
    int64_t *o = (int64_t *)out.buf;
    Py_ssize_t n = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < rows; k++) {
        const Py_ssize_t row = k * v;
        const double level = th[k];
        const int64_t keep = best[k];
        for (Py_ssize_t j = 0; j < v; j++) {
            const Py_ssize_t i = row + j;
            if (g[bn[i] & (n_bounds - 1)] + x[i] >= level || j == keep) {    /* (the mask only guards memory) */
                if (n < cap) o[n] = (int64_t)i;
                n++;
            }
        }
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(n);
done:
    PyBuffer_Release(&bins);
    PyBuffer_Release(&base);
    PyBuffer_Release(&threshold);
    PyBuffer_Release(&top);
    PyBuffer_Release(&bounds);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"bins_into", bins_into, METH_VARARGS, "bins_into(prefix_a, V, bits, out): every token's lane-A top bits"},
    {"gumbel_at_into", gumbel_at_into, METH_VARARGS, "gumbel_at_into(prefix_a, prefix_b, tokens, out): exact values"},
    {"candidates_into", candidates_into, METH_VARARGS,
     "candidates_into(bins, base, threshold, top, bounds, V, out) -> n: flat indices of the candidates"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_sampling", NULL, -1, methods};

PyMODINIT_FUNC PyInit__sampling(void) { return PyModule_Create(&module); }
