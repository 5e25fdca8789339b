/* The C library's float64 log, exp, log1p and tanh over contiguous buffers: spot.runtime.libm's fast backend.
 *
 * Why a C loop: the noise and the softmax are defined with glibc's scalar log/exp (docs/noise.md). numpy calls
 * them only where it has no SIMD kernel of its own; on AVX-512 CPUs its own kernels differ in the last bit.
 * log1p and tanh weigh tree candidates; with the C library's values the C++ host builds the same trees.
 * Nothing here does arithmetic, so compiler flags cannot change a result: each element is one libm call. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

static PyObject *apply(PyObject *args, double (*fn)(double)) {
    Py_buffer src, dst;
    if (!PyArg_ParseTuple(args, "y*w*", &src, &dst)) return NULL;
    if (src.len != dst.len || src.len % (Py_ssize_t)sizeof(double) != 0) {
        PyErr_Format(PyExc_ValueError, "got buffers of %zd and %zd bytes, expected equal multiples of 8",
                     src.len, dst.len);
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        return NULL;
    }
    const double *x = (const double *)src.buf;
    double *y = (double *)dst.buf;
    Py_ssize_t n = src.len / (Py_ssize_t)sizeof(double);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) y[i] = fn(x[i]);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_RETURN_NONE;
}

static double call_log(double x) { return log(x); }
static double call_exp(double x) { return exp(x); }
static double call_log1p(double x) { return log1p(x); }
static double call_tanh(double x) { return tanh(x); }

static PyObject *log_into(PyObject *self, PyObject *args) { return apply(args, call_log); }
static PyObject *exp_into(PyObject *self, PyObject *args) { return apply(args, call_exp); }
static PyObject *log1p_into(PyObject *self, PyObject *args) { return apply(args, call_log1p); }
static PyObject *tanh_into(PyObject *self, PyObject *args) { return apply(args, call_tanh); }

static PyMethodDef methods[] = {
    {"log_into", log_into, METH_VARARGS, "log_into(src, dst): dst[i] = log(src[i]), contiguous float64 buffers"},
    {"exp_into", exp_into, METH_VARARGS, "exp_into(src, dst): dst[i] = exp(src[i]), contiguous float64 buffers"},
    {"log1p_into", log1p_into, METH_VARARGS, "log1p_into(src, dst): dst[i] = log1p(src[i])"},
    {"tanh_into", tanh_into, METH_VARARGS, "tanh_into(src, dst): dst[i] = tanh(src[i])"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_libm", NULL, -1, methods};

PyMODINIT_FUNC PyInit__libm(void) { return PyModule_Create(&module); }
