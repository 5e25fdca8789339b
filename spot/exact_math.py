"""exp, log and sum that equal the numpy runtime's float64 results bit for bit, written once for numpy, torch and ONNX.

Why: the numpy runtime (spot.runtime.noise / step) computes `-log(-log(u))`, `exp(z - max)` and `e.sum(-1)` with the
C library's log/exp (spot.runtime.libm: glibc's, whatever SIMD kernels numpy has) and numpy's pairwise summation.
ONNX Runtime's float64 Exp/Log (Eigen polynomials) differ from glibc in about 25% of inputs by 1-2 ulp, torch uses
SLEEF, and ReduceSum adds in another order, so an epilogue built from those ops cannot match the runtime bit for
bit. This module re-states the exact algorithms as sequences of IEEE float64 +, -, *, comparisons, table lookups and
exact integer ops, which every backend evaluates identically:
- `glibc_exp`, `glibc_log`: glibc >= 2.28's exp/log (the Arm Optimized Routines algorithms, tables below) as built
  for x86-64 CPUs with FMA (the `__exp_fma`/`__log_fma` ifunc variants, compiled with fp contraction, which is what
  the runtime calls on this project's CI machine). Every fused multiply-add that GCC forms there is emulated exactly
  with Dekker's product and Boldo-Melquiond's round-to-odd sum (`fma`).
- `pairwise_sum`: numpy's `pairwise_sum` (8 accumulators over blocks of <= 128, halves rounded to multiples of 8).
Domains (all that the sampling epilogue needs): `glibc_log` for positive normal finite x; `glibc_exp` for finite
x (x <= -1024 gives 0, x >= 1024 inf); `pairwise_sum` for finite non-negative terms.
Known limit: the reference is the C library of x86-64 glibc with FMA. On CPUs without FMA glibc runs its non-FMA
variants, which differ from these in ~0.05% of exp results by 1 ulp; aarch64 glibc (Jetson) rounds exp's reduction
index with ties away from zero; both only matter when comparing the runtime across machines (docs/noise.md).

Tables and coefficients: Arm Optimized Routines math/log_data.c and exp_data.c (Copyright (c) 2018 Arm Limited,
MIT / Apache-2.0), identical to glibc's __log_data/__exp_data. The exp table is regenerated here from its
definition (2^(k/128) rounded, and the rounding's relative tail) and checked against published entries in tests.

The backends implement a small `Ops` interface (NumpyOps here; TorchOps in spot/reference/noise_torch.py; the
ONNX node emitter in spot/export/epilogue_graph.py); values are whatever the backend uses (arrays, tensors, names).
"""
from __future__ import annotations

import platform
from decimal import Decimal, localcontext
from functools import lru_cache

import numpy as np

# -- glibc log data (Arm Optimized Routines log_data.c, N = 128) -----------------------------------------------
LOG_LN2HI = float.fromhex("0x1.62e42fefa3800p-1")
LOG_LN2LO = float.fromhex("0x1.ef35793c76730p-45")
LOG_POLY1 = [float.fromhex(h) for h in (   # B: log1p(r) near 1
    "-0x1p-1", "0x1.5555555555577p-2", "-0x1.ffffffffffdcbp-3", "0x1.999999995dd0cp-3", "-0x1.55555556745a7p-3",
    "0x1.24924a344de3p-3", "-0x1.fffffa4423d65p-4", "0x1.c7184282ad6cap-4", "-0x1.999eb43b068ffp-4",
    "0x1.78182f7afd085p-4", "-0x1.5521375d145cdp-4")]
LOG_POLY = [float.fromhex(h) for h in (    # A: log1p(r) - r on the table path
    "-0x1.0000000000001p-1", "0x1.555555551305bp-2", "-0x1.fffffffeb459p-3", "0x1.999b324f10111p-3",
    "-0x1.55575e506c89fp-3")]
# log table: (invc, logc) pairs, two entries per line
_LOG_TAB_HEX = """
0x1.734f0c3e0de9fp+0 -0x1.7cc7f79e69000p-2  0x1.713786a2ce91fp+0 -0x1.76feec20d0000p-2
0x1.6f26008fab5a0p+0 -0x1.713e31351e000p-2  0x1.6d1a61f138c7dp+0 -0x1.6b85b38287800p-2
0x1.6b1490bc5b4d1p+0 -0x1.65d5590807800p-2  0x1.69147332f0cbap+0 -0x1.602d076180000p-2
0x1.6719f18224223p+0 -0x1.5a8ca86909000p-2  0x1.6524f99a51ed9p+0 -0x1.54f4356035000p-2
0x1.63356aa8f24c4p+0 -0x1.4f637c36b4000p-2  0x1.614b36b9ddc14p+0 -0x1.49da7fda85000p-2
0x1.5f66452c65c4cp+0 -0x1.445923989a800p-2  0x1.5d867b5912c4fp+0 -0x1.3edf439b0b800p-2
0x1.5babccb5b90dep+0 -0x1.396ce448f7000p-2  0x1.59d61f2d91a78p+0 -0x1.3401e17bda000p-2
0x1.5805612465687p+0 -0x1.2e9e2ef468000p-2  0x1.56397cee76bd3p+0 -0x1.2941b3830e000p-2
0x1.54725e2a77f93p+0 -0x1.23ec58cda8800p-2  0x1.52aff42064583p+0 -0x1.1e9e129279000p-2
0x1.50f22dbb2bddfp+0 -0x1.1956d2b48f800p-2  0x1.4f38f4734ded7p+0 -0x1.141679ab9f800p-2
0x1.4d843cfde2840p+0 -0x1.0edd094ef9800p-2  0x1.4bd3ec078a3c8p+0 -0x1.09aa518db1000p-2
0x1.4a27fc3e0258ap+0 -0x1.047e65263b800p-2  0x1.4880524d48434p+0 -0x1.feb224586f000p-3
0x1.46dce1b192d0bp+0 -0x1.f474a7517b000p-3  0x1.453d9d3391854p+0 -0x1.ea4443d103000p-3
0x1.43a2744b4845ap+0 -0x1.e020d44e9b000p-3  0x1.420b54115f8fbp+0 -0x1.d60a22977f000p-3
0x1.40782da3ef4b1p+0 -0x1.cc00104959000p-3  0x1.3ee8f5d57fe8fp+0 -0x1.c202956891000p-3
0x1.3d5d9a00b4ce9p+0 -0x1.b81178d811000p-3  0x1.3bd60c010c12bp+0 -0x1.ae2c9ccd3d000p-3
0x1.3a5242b75dab8p+0 -0x1.a45402e129000p-3  0x1.38d22cd9fd002p+0 -0x1.9a877681df000p-3
0x1.3755bc5847a1cp+0 -0x1.90c6d69483000p-3  0x1.35dce49ad36e2p+0 -0x1.87120a645c000p-3
0x1.34679984dd440p+0 -0x1.7d68fb4143000p-3  0x1.32f5cceffcb24p+0 -0x1.73cb83c627000p-3
0x1.3187775a10d49p+0 -0x1.6a39a9b376000p-3  0x1.301c8373e3990p+0 -0x1.60b3154b7a000p-3
0x1.2eb4ebb95f841p+0 -0x1.5737d76243000p-3  0x1.2d50a0219a9d1p+0 -0x1.4dc7b8fc23000p-3
0x1.2bef9a8b7fd2ap+0 -0x1.4462c51d20000p-3  0x1.2a91c7a0c1babp+0 -0x1.3b08abc830000p-3
0x1.293726014b530p+0 -0x1.31b996b490000p-3  0x1.27dfa5757a1f5p+0 -0x1.2875490a44000p-3
0x1.268b39b1d3bbfp+0 -0x1.1f3b9f879a000p-3  0x1.2539d838ff5bdp+0 -0x1.160c8252ca000p-3
0x1.23eb7aac9083bp+0 -0x1.0ce7f57f72000p-3  0x1.22a012ba940b6p+0 -0x1.03cdc49fea000p-3
0x1.2157996cc4132p+0 -0x1.f57bdbc4b8000p-4  0x1.201201dd2fc9bp+0 -0x1.e370896404000p-4
0x1.1ecf4494d480bp+0 -0x1.d17983ef94000p-4  0x1.1d8f5528f6569p+0 -0x1.bf9674ed8a000p-4
0x1.1c52311577e7cp+0 -0x1.adc79202f6000p-4  0x1.1b17c74cb26e9p+0 -0x1.9c0c3e7288000p-4
0x1.19e010c2c1ab6p+0 -0x1.8a646b372c000p-4  0x1.18ab07bb670bdp+0 -0x1.78d01b3ac0000p-4
0x1.1778a25efbcb6p+0 -0x1.674f145380000p-4  0x1.1648d354c31dap+0 -0x1.55e0e6d878000p-4
0x1.151b990275fddp+0 -0x1.4485cdea1e000p-4  0x1.13f0ea432d24cp+0 -0x1.333d94d6aa000p-4
0x1.12c8b7210f9dap+0 -0x1.22079f8c56000p-4  0x1.11a3028ecb531p+0 -0x1.10e4698622000p-4
0x1.107fbda8434afp+0 -0x1.ffa6c6ad20000p-5  0x1.0f5ee0f4e6bb3p+0 -0x1.dda8d4a774000p-5
0x1.0e4065d2a9fcep+0 -0x1.bbcece4850000p-5  0x1.0d244632ca521p+0 -0x1.9a1894012c000p-5
0x1.0c0a77ce2981ap+0 -0x1.788583302c000p-5  0x1.0af2f83c636d1p+0 -0x1.5715e67d68000p-5
0x1.09ddb98a01339p+0 -0x1.35c8a49658000p-5  0x1.08cabaf52e7dfp+0 -0x1.149e364154000p-5
0x1.07b9f2f4e28fbp+0 -0x1.e72c082eb8000p-6  0x1.06ab58c358f19p+0 -0x1.a55f152528000p-6
0x1.059eea5ecf92cp+0 -0x1.63d62cf818000p-6  0x1.04949cdd12c90p+0 -0x1.228fb8caa0000p-6
0x1.038c6c6f0ada9p+0 -0x1.c317b20f90000p-7  0x1.02865137932a9p+0 -0x1.419355daa0000p-7
0x1.0182427ea7348p+0 -0x1.81203c2ec0000p-8  0x1.008040614b195p+0 -0x1.0040979240000p-9
0x1.fe01ff726fa1ap-1 0x1.feff384900000p-9  0x1.fa11cc261ea74p-1 0x1.7dc41353d0000p-7
0x1.f6310b081992ep-1 0x1.3cea3c4c28000p-6  0x1.f25f63ceeadcdp-1 0x1.b9fc114890000p-6
0x1.ee9c8039113e7p-1 0x1.1b0d8ce110000p-5  0x1.eae8078cbb1abp-1 0x1.58a5bd001c000p-5
0x1.e741aa29d0c9bp-1 0x1.95c8340d88000p-5  0x1.e3a91830a99b5p-1 0x1.d276aef578000p-5
0x1.e01e009609a56p-1 0x1.07598e598c000p-4  0x1.dca01e577bb98p-1 0x1.253f5e30d2000p-4
0x1.d92f20b7c9103p-1 0x1.42edd8b380000p-4  0x1.d5cac66fb5ccep-1 0x1.606598757c000p-4
0x1.d272caa5ede9dp-1 0x1.7da76356a0000p-4  0x1.cf26e3e6b2ccdp-1 0x1.9ab434e1c6000p-4
0x1.cbe6da2a77902p-1 0x1.b78c7bb0d6000p-4  0x1.c8b266d37086dp-1 0x1.d431332e72000p-4
0x1.c5894bd5d5804p-1 0x1.f0a3171de6000p-4  0x1.c26b533bb9f8cp-1 0x1.067152b914000p-3
0x1.bf583eeece73fp-1 0x1.147858292b000p-3  0x1.bc4fd75db96c1p-1 0x1.2266ecdca3000p-3
0x1.b951e0c864a28p-1 0x1.303d7a6c55000p-3  0x1.b65e2c5ef3e2cp-1 0x1.3dfc33c331000p-3
0x1.b374867c9888bp-1 0x1.4ba366b7a8000p-3  0x1.b094b211d304ap-1 0x1.5933928d1f000p-3
0x1.adbe885f2ef7ep-1 0x1.66acd2418f000p-3  0x1.aaf1d31603da2p-1 0x1.740f8ec669000p-3
0x1.a82e63fd358a7p-1 0x1.815c0f51af000p-3  0x1.a5740ef09738bp-1 0x1.8e92954f68000p-3
0x1.a2c2a90ab4b27p-1 0x1.9bb3602f84000p-3  0x1.a01a01393f2d1p-1 0x1.a8bed1c2c0000p-3
0x1.9d79f24db3c1bp-1 0x1.b5b515c01d000p-3  0x1.9ae2505c7b190p-1 0x1.c2967ccbcc000p-3
0x1.9852ef297ce2fp-1 0x1.cf635d5486000p-3  0x1.95cbaeea44b75p-1 0x1.dc1bd3446c000p-3
0x1.934c69de74838p-1 0x1.e8c01b8cfe000p-3  0x1.90d4f2f6752e6p-1 0x1.f5509c0179000p-3
0x1.8e6528effd79dp-1 0x1.00e6c121fb800p-2  0x1.8bfce9fcc007cp-1 0x1.071b80e93d000p-2
0x1.899c0dabec30ep-1 0x1.0d46b9e867000p-2  0x1.87427aa2317fbp-1 0x1.13687334bd000p-2
0x1.84f00acb39a08p-1 0x1.1980d67234800p-2  0x1.82a49e8653e55p-1 0x1.1f8ffe0cc8000p-2
0x1.8060195f40260p-1 0x1.2595fd7636800p-2  0x1.7e22563e0a329p-1 0x1.2b9300914a800p-2
0x1.7beb377dcb5adp-1 0x1.3187210436000p-2  0x1.79baa679725c2p-1 0x1.377266dec1800p-2
0x1.77907f2170657p-1 0x1.3d54ffbaf3000p-2  0x1.756cadbd6130cp-1 0x1.432eee32fe000p-2
"""
_LOG_TAB = np.array([float.fromhex(h) for h in _LOG_TAB_HEX.split()]).reshape(128, 2)
LOG_INVC = _LOG_TAB[:, 0].copy()
LOG_LOGC = _LOG_TAB[:, 1].copy()
LOG_OFF_MANT = 3 << 49          # mantissa bits of OFF = 0x3fe6000000000000 (0x1.6p-1): 0.375 * 2**52

# -- glibc exp data (exp_data.c, N = 128, EXP_POLY_ORDER 5) --------------------------------------------------------
EXP_N = 128
EXP_INVLN2N = float.fromhex("0x1.71547652b82fep0") * EXP_N
EXP_SHIFT = float.fromhex("0x1.8p52")
EXP_NEGLN2HIN = float.fromhex("-0x1.62e42fefa0000p-8")
EXP_NEGLN2LON = float.fromhex("-0x1.cf79abc9e3b3ap-47")
EXP_C2, EXP_C3, EXP_C4, EXP_C5 = (float.fromhex(h) for h in (
    "0x1.ffffffffffdbdp-2", "0x1.555555555543cp-3", "0x1.55555cf172b91p-5", "0x1.1111167a4d017p-7"))


def reference_platform() -> bool:
    """Whether the C library's exp/log here are glibc's (>= 2.28) FMA variants — x86-64 Linux on an FMA CPU — the
    platform whose results this module reproduces bit for bit (docs/noise.md). Elsewhere libm may round
    differently."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    libc, version = platform.libc_ver()
    try:
        new_enough = tuple(int(x) for x in version.split(".")[:2]) >= (2, 28)
    except ValueError:
        return False
    return platform.machine() == "x86_64" and libc == "glibc" and " fma " in flags and new_enough


@lru_cache(maxsize=None)
def exp_table() -> tuple[np.ndarray, np.ndarray]:
    """(H, tail): 2^(k/128) ~= H[k] * (1 + tail[k]); H[k] = 2^(k/128) rounded to nearest, tail[k] the rounded
    relative remainder (exp_data.c's definition; Python's float(str) rounds correctly)."""
    heads, tails = [], []
    with localcontext() as ctx:
        ctx.prec = 80
        ln2 = Decimal(2).ln()
        for k in range(EXP_N):
            exact = (ln2 * k / EXP_N).exp()
            head = float(exact)
            heads.append(head)
            tails.append(float(exact / Decimal(head) - 1))
    return np.array(heads), np.array(tails)


POW2_MIN, POW2_MAX = -1074, 1023
POW2 = np.array([2.0 ** e for e in range(POW2_MIN, POW2_MAX + 1)])   # exact powers of two, subnormals included
PHI = 2.0 ** -53 + 2.0 ** -105      # Rump-Zimmermann-Boldo-Melquiond successor constant (exact in float64)
SPLITTER = 2.0 ** 27 + 1.0          # Veltkamp split of a float64 into two 26-bit halves


# -- exact building blocks ---------------------------------------------------------------------------------------
def pow2(ops, e):
    """2.0**e for int64 e in [-1074, 1023], exactly (table lookup)."""
    return ops.gather(POW2, ops.add(e, ops.i(-POW2_MIN)))


def two_sum(ops, a, b):
    """s + err == a + b exactly, s = RN(a + b) (Knuth)."""
    s = ops.add(a, b)
    bb = ops.sub(s, a)
    err = ops.add(ops.sub(a, ops.sub(s, bb)), ops.sub(b, bb))
    return s, err


def _split(ops, a):
    c = ops.mul(ops.f(SPLITTER), a)
    hi = ops.sub(c, ops.sub(c, a))
    return hi, ops.sub(a, hi)


def two_prod(ops, a, b):
    """p + err == a * b exactly, p = RN(a * b) (Dekker; valid without overflow/underflow of the partial products)."""
    p = ops.mul(a, b)
    ah, al = _split(ops, a)
    bh, bl = _split(ops, b)
    err = ops.add(ops.add(ops.add(ops.sub(ops.mul(ah, bh), p), ops.mul(ah, bl)), ops.mul(al, bh)), ops.mul(al, bl))
    return p, err


def _add_round_to_odd(ops, a, b):
    """a + b rounded to odd: RN(a + b) if exact, else whichever neighbour of the exact sum has an odd last bit."""
    s, err = two_sum(ops, a, b)
    step = ops.mul(ops.abs(s), ops.f(PHI))                         # succ/pred of s by one rounded addition
    other = ops.where(ops.gt(err, ops.f(0.0)), ops.add(s, step), ops.sub(s, step))
    s_is_even = ops.eq(ops.mul(ops.add(s, other), ops.f(0.5)), s)   # s + other is a tie: it rounds to the even one
    return ops.where(ops.and_(ops.ne(err, ops.f(0.0)), s_is_even), other, s)


def fma(ops, a, b, c):
    """RN(a * b + c) with one rounding, from plain float64 ops (Boldo & Melquiond 2008, emulated FMA via
    rounding to odd). Exact wherever two_prod is exact and the operands are not near the underflow threshold."""
    uh, ul = two_prod(ops, a, b)
    th, tl = two_sum(ops, c, uh)
    return ops.add(th, _add_round_to_odd(ops, tl, ul))


# -- glibc exp ----------------------------------------------------------------------------------------------------
def glibc_exp(ops, x):
    """exp(x) exactly as glibc's __exp_fma (e_exp.c; contraction as GCC forms it for -mfma)."""
    heads, tails = exp_table()
    # kd = round(x * N/ln2): z + Shift is contracted into fma(InvLn2N, x, Shift).
    kd = ops.sub(fma(ops, ops.f(EXP_INVLN2N), x, ops.f(EXP_SHIFT)), ops.f(EXP_SHIFT))
    big = ops.ge(ops.abs(x), ops.f(512.0))
    ki = ops.to_int(ops.where(ops.ge(ops.abs(x), ops.f(1024.0)), ops.f(0.0), kd))
    r = fma(ops, kd, ops.f(EXP_NEGLN2LON), fma(ops, kd, ops.f(EXP_NEGLN2HIN), x))
    top, idx = ops.divmod_const(ki, EXP_N)                     # 2^(k/N) = 2^top * 2^(idx/N)
    tail = ops.gather(tails, idx)
    head = ops.gather(heads, idx)
    r2 = ops.mul(r, r)
    tmp = fma(ops, ops.mul(r2, r2), fma(ops, r, ops.f(EXP_C5), ops.f(EXP_C4)),
              fma(ops, r2, fma(ops, r, ops.f(EXP_C3), ops.f(EXP_C2)), ops.add(tail, r)))
    # Common path: scale * (1 + tmp) with scale = head * 2^top; scaling by 2^top commutes with rounding here
    # (the result is normal), so the fma runs on head in [1, 2) where Dekker's product cannot underflow.
    normal = ops.mul(fma(ops, head, tmp, head), pow2(ops, ops.clip_int(top, -1022, 1023)))
    # |x| >= 512, x < 0: glibc's specialcase() for results that may be subnormal. GCC does not contract here
    # (scale * tmp has two uses, one inside a branch): plain products, verified against glibc.
    s_lo = ops.mul(head, pow2(ops, ops.clip_int(ops.add(top, ops.i(1022)), -1022, 1023)))
    s_tmp = ops.mul(s_lo, tmp)
    y = ops.add(s_lo, s_tmp)
    lo = ops.add(ops.sub(s_lo, y), s_tmp)
    hi = ops.add(ops.f(1.0), y)
    lo = ops.add(ops.add(ops.sub(ops.f(1.0), hi), y), lo)
    y_small = ops.sub(ops.add(hi, lo), ops.f(1.0))
    under = ops.mul(ops.f(2.0 ** -1022), ops.where(ops.lt(y, ops.f(1.0)), y_small, y))
    # |x| >= 512, x > 0: scale's exponent is lowered by 1009 and restored after the product.
    s_hi = ops.mul(head, pow2(ops, ops.clip_int(ops.sub(top, ops.i(1009)), -1022, 1023)))
    over = ops.mul(ops.f(2.0 ** 1009), fma(ops, s_hi, tmp, s_hi))
    out = ops.where(big, ops.where(ops.lt(x, ops.f(0.0)), under, over), normal)
    out = ops.where(ops.lt(ops.abs(x), ops.f(2.0 ** -54)), ops.add(ops.f(1.0), x), out)
    huge = ops.ge(ops.abs(x), ops.f(1024.0))
    return ops.where(huge, ops.where(ops.lt(x, ops.f(0.0)), ops.f(0.0), ops.f(float("inf"))), out)


# -- glibc log ----------------------------------------------------------------------------------------------------
def _log_near_one(ops, x):
    """glibc log for 1 - 2^-4 <= x < 1 + 0x1.09p-4 (poly1 path)."""
    b = [ops.f(v) for v in LOG_POLY1]
    r = ops.sub(x, ops.f(1.0))
    r2 = ops.mul(r, r)
    r3 = ops.mul(r, r2)
    inner = fma(ops, r3, b[10], fma(ops, r2, b[9], fma(ops, r, b[8], b[7])))
    middle = fma(ops, r3, inner, fma(ops, r2, b[6], fma(ops, r, b[5], b[4])))
    outer = fma(ops, r3, middle, fma(ops, r2, b[3], fma(ops, r, b[2], b[1])))
    w = ops.mul(r, ops.f(2.0 ** 27))
    rhi = ops.sub(ops.add(r, w), w)
    rlo = ops.sub(r, rhi)
    w = ops.mul(ops.mul(rhi, rhi), b[0])        # exact: rhi has <= 26 bits, b[0] = -0.5
    hi = ops.add(r, w)
    lo = ops.add(ops.sub(r, hi), w)
    lo = fma(ops, ops.mul(b[0], rlo), ops.add(rhi, r), lo)
    # `y = r3 * (...); y += lo;` GCC contracts across the two statements: y = fma(r3, outer, lo).
    return ops.add(fma(ops, r3, outer, lo), hi)


def _log_table(ops, x):
    """glibc log's table path: x = 2^k z, log(x) = k ln2 + log(c) + log1p(z/c - 1)."""
    e = ops.exponent(x)                                        # x = m 2^e, m in [1, 2)
    mant = ops.to_int(ops.mul(ops.sub(ops.mul(x, pow2(ops, ops.neg_int(e))), ops.f(1.0)), ops.f(2.0 ** 52)))
    # tmp = bits(x) - OFF;  k = tmp >> 52;  i = (tmp >> 45) % 128;  z = x / 2^k
    below = ops.lt(mant, ops.i(LOG_OFF_MANT))
    k = ops.where(below, e, ops.add(e, ops.i(1)))
    low = ops.where(below, ops.add(mant, ops.i((1 << 52) - LOG_OFF_MANT)), ops.sub(mant, ops.i(LOG_OFF_MANT)))
    i, _ = ops.divmod_const(low, 1 << 45)
    z = ops.mul(x, pow2(ops, ops.neg_int(k)))
    invc = ops.gather(LOG_INVC, i)
    logc = ops.gather(LOG_LOGC, i)
    r = fma(ops, z, invc, ops.f(-1.0))                         # explicit __builtin_fma in glibc
    kd = ops.to_float(k)
    w = ops.add(ops.mul(kd, ops.f(LOG_LN2HI)), logc)           # kd * Ln2hi is exact (42-bit constant, |k| < 2^11)
    hi = ops.add(w, r)
    lo = fma(ops, kd, ops.f(LOG_LN2LO), ops.add(ops.sub(w, hi), r))
    a = [ops.f(v) for v in LOG_POLY]
    r2 = ops.mul(r, r)
    inner = fma(ops, r2, fma(ops, r, a[4], a[3]), fma(ops, r, a[2], a[1]))
    y = fma(ops, ops.mul(r, r2), inner, fma(ops, r2, a[0], lo))
    return ops.add(y, hi)


def glibc_log(ops, x):
    """log(x) exactly as glibc's __log_fma (e_log.c), for positive normal finite x."""
    near = ops.and_(ops.ge(x, ops.f(1.0 - 2.0 ** -4)), ops.lt(x, ops.f(1.0 + float.fromhex("0x1.09p-4"))))
    return ops.where(near, _log_near_one(ops, x), _log_table(ops, x))


# -- numpy's pairwise summation --------------------------------------------------------------------------------
PW_BLOCKSIZE = 128


@lru_cache(maxsize=None)
def pairwise_plan(n: int):
    """numpy's pairwise_sum recursion for length n as data: leaves (start, length) left to right, and the
    internal additions grouped by height: a list of levels, each (left ids, right ids) into the growing list of
    node values (leaves first, then each level's results in order). Returns (leaves, levels, root id)."""
    leaves: list[tuple[int, int]] = []
    nodes: list[tuple[int, int, int]] = []          # (height, left, right) with provisional ids

    def rec(start: int, length: int) -> tuple[int, int]:        # -> (provisional id, height)
        if length <= PW_BLOCKSIZE:
            leaves.append((start, length))
            return ("leaf", len(leaves) - 1), 0
        half = length // 2
        half -= half % 8
        left, hl = rec(start, half)
        right, hr = rec(start + half, length - half)
        nodes.append((max(hl, hr) + 1, left, right))
        return ("node", len(nodes) - 1), max(hl, hr) + 1

    root, _ = rec(0, n)
    ids = {("leaf", j): j for j in range(len(leaves))}
    levels = []
    next_id = len(leaves)
    for h in range(1, max((nd[0] for nd in nodes), default=0) + 1):
        lefts, rights = [], []
        for j, (height, left, right) in enumerate(nodes):
            if height == h:
                lefts.append(ids[left])
                rights.append(ids[right])
                ids[("node", j)] = next_id
                next_id += 1
        levels.append((np.array(lefts, dtype=np.int64), np.array(rights, dtype=np.int64)))
    return leaves, levels, ids[root]


def pairwise_sum(ops, x, n: int):
    """Sum over the last axis (length n) in numpy's pairwise order; terms must be finite and >= 0 (padding adds
    +0.0, which leaves such partial sums unchanged)."""
    leaves, levels, root = pairwise_plan(n)
    chunks = max(1, max(length // 8 for _, length in leaves))
    pad = n                                          # index of the appended zero column
    body = np.full((len(leaves), chunks, 8), pad, dtype=np.int64)
    tail = np.full((len(leaves), 7), pad, dtype=np.int64)
    for j, (start, length) in enumerate(leaves):
        full = length // 8
        body[j, :full] = start + np.arange(full * 8).reshape(full, 8)
        rest = np.arange(start + full * 8, start + length)
        tail[j, :rest.size] = rest
    xz = ops.pad_zero_last(x)
    g = ops.take_last(xz, body)                      # [..., leaves, chunks, 8]
    acc = ops.select(g, -2, 0)                       # r[0..7] = a[0..7]; r[j] += a[i+j] chunk by chunk
    for c in range(1, chunks):
        acc = ops.add(acc, ops.select(g, -2, c))
    r = [ops.select(acc, -1, j) for j in range(8)]
    res = ops.add(ops.add(ops.add(r[0], r[1]), ops.add(r[2], r[3])), ops.add(ops.add(r[4], r[5]), ops.add(r[6], r[7])))
    t = ops.take_last(xz, tail)                      # [..., leaves, 7]
    for j in range(7):
        res = ops.add(res, ops.select(t, -1, j))
    vals = res                                       # [..., leaves]
    for lefts, rights in levels:
        vals = ops.concat_last([vals, ops.add(ops.take_last(vals, lefts), ops.take_last(vals, rights))])
    return ops.select(vals, -1, root)


# -- the numpy backend --------------------------------------------------------------------------------------------
class NumpyOps:
    """Ops on numpy float64 / int64 arrays (reference and tests)."""

    f = staticmethod(np.float64)
    i = staticmethod(np.int64)
    add = staticmethod(np.add)
    sub = staticmethod(np.subtract)
    mul = staticmethod(np.multiply)
    abs = staticmethod(np.abs)
    lt = staticmethod(np.less)
    le = staticmethod(np.less_equal)
    gt = staticmethod(np.greater)
    ge = staticmethod(np.greater_equal)
    eq = staticmethod(np.equal)
    ne = staticmethod(np.not_equal)
    and_ = staticmethod(np.logical_and)
    where = staticmethod(np.where)

    @staticmethod
    def to_int(x):
        return np.asarray(x).astype(np.int64)

    @staticmethod
    def to_float(x):
        return np.asarray(x).astype(np.float64)

    @staticmethod
    def neg_int(x):
        return -np.asarray(x, dtype=np.int64)

    @staticmethod
    def clip_int(x, lo: int, hi: int):
        return np.clip(x, lo, hi)

    @staticmethod
    def divmod_const(x, d: int):
        return np.divmod(np.asarray(x, dtype=np.int64), np.int64(d))

    @staticmethod
    def gather(table, idx):
        return np.asarray(table)[idx]

    @staticmethod
    def exponent(x):
        _, e = np.frexp(x)                          # x = m 2^e with m in [0.5, 1)
        return e.astype(np.int64) - 1

    @staticmethod
    def pad_zero_last(x):
        return np.concatenate([x, np.zeros(x.shape[:-1] + (1,), dtype=x.dtype)], axis=-1)

    @staticmethod
    def take_last(x, idx):
        return x[..., np.asarray(idx)]

    @staticmethod
    def select(x, axis: int, index: int):
        return np.take(x, index, axis=axis)

    @staticmethod
    def concat_last(xs):
        return np.concatenate(xs, axis=-1)


NUMPY = NumpyOps()


def exp_np(x) -> np.ndarray:
    """glibc_exp on numpy arrays (float64)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return np.asarray(glibc_exp(NUMPY, np.asarray(x, dtype=np.float64)), dtype=np.float64)


def log_np(x) -> np.ndarray:
    """glibc_log on numpy arrays (float64, positive normal inputs)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        return np.asarray(glibc_log(NUMPY, np.asarray(x, dtype=np.float64)), dtype=np.float64)
