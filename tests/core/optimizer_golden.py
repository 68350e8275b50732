#!/usr/bin/env python3
"""Golden values for tests/core/test_optimizers.cpp, computed in double precision from the published update
equations, independently of the library's rules (no code shared with them).

Writes tests/core/optimizer_golden.hpp; with --check, fails when that file differs from what this script
produces (a meson test runs it so). Standard library only.

  AdamW (Loshchilov & Hutter 2019, as torch.optim.AdamW):
      m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  m^ = m / (1 - b1^t);  v^ = v / (1 - b2^t)
      w = w - lr (m^ / (sqrt(v^) + eps) + wd w)
  SGD (as torch.optim.SGD, dampening 0):
      g' = g + wd w;  buf = g' at t = 1, else mu buf + g';  d = g' + mu buf if nesterov else buf
      w = w - lr d
  Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2):
      c = b1 m + (1 - b1) g;  w = w - lr (sign(c) + wd w);  m = b2 m + (1 - b2) g
  LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning", Algorithm 2, with Adam's bias correction):
      m, v, m^, v^ as AdamW;  r = m^ / (sqrt(v^) + eps) + wd w, per tensor:
      w = w - lr phi(||w||) / ||r|| r,  phi(z) = min(max(z, phi_min), phi_max), the ratio 1 where phi or ||r|| is 0
      The elements are cut into tensors (TENSORS), each with its own norms.
  Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks", the reference implementation),
  per 2-D tensor of shape (rows, cols):
      m = mu m + (1 - mu) g;  u = (1 - mu) g + mu m if nesterov else m;  O = NS5(u)
      w = (1 - lr wd) w - lr sqrt(max(1, rows / cols)) O
      NS5: X = u / (||u||_F + 1e-7), transposed where rows > cols; five times A = X X^T, B = b A + c A A,
      X = a X + B X, (a, b, c) = (3.4445, -4.7750, 2.0315); transposed back.
      Every other tensor: AdamW with lr x adamw_lr_scale and the same weight decay. The elements are cut
      into tensors of the case's SHAPES.
  Adafactor (Shazeer & Stern 2018, as torch.optim.Adafactor), per tensor of the case's SHAPES:
      beta = t^beta2_decay;  rho = min(lr, 1 / sqrt(t));  alpha = max(eps2, RMS(w)) rho;  w = (1 - lr wd) w
      a matrix: R = R + beta (mean_j g^2 - R);  C = C + beta (mean_i g^2 - C);  V = R C^T / max(mean(R), eps1)
      a vector: V = V + beta (g^2 - V)
      U = g / sqrt(max(V, eps1^2));  w = w - alpha / max(1, RMS(U) / d) U
"""
import math
import pathlib
import struct
import sys

STEPS = 5      # several steps, the first included (t = 1 is where SGD's buffer and Adam's bias differ)
ELEMENTS = 8


def f32(x):
    """The float32 nearest to x, as a double: what the C++ side stores."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


class Rng:
    """A fixed linear congruential generator, so the inputs never change."""

    def __init__(self, seed):
        self.s = seed

    def uniform(self, lo, hi):
        self.s = (self.s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        return lo + (hi - lo) * ((self.s >> 11) / float(1 << 53))


def adamw(hp, w, grads):
    lr, b1, b2, eps, wd = hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"]
    m = [0.0] * len(w)
    v = [0.0] * len(w)
    out = []
    for t, g in enumerate(grads, start=1):
        for i in range(len(w)):
            m[i] = b1 * m[i] + (1 - b1) * g[i]
            v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i]
            m_hat = m[i] / (1 - b1 ** t)
            v_hat = v[i] / (1 - b2 ** t)
            w[i] = w[i] - lr * (m_hat / (math.sqrt(v_hat) + eps) + wd * w[i])
        out.append(list(w))
    return out


def bits32(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def from_bits32(u):
    return struct.unpack("<f", struct.pack("<I", u & 0xFFFFFFFF))[0]


def mix32(x):
    """lowbias32 (C. Wellons, hash-prospector)."""
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    x ^= x >> 16
    return x


def round_bf16_stochastic(x, r):
    """x's float32 bits rounded to a bf16's: up in magnitude where the dropped 16 bits + r's low 16 carry."""
    return (bits32(x) + (r & 0xFFFF)) & 0xFFFF0000


def adamw_bf16(hp, w, grads):
    lr, b1, b2, eps, wd = hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"]
    word = [0] * len(w)
    omb1, omb2 = f32(1 - b1), f32(1 - b2)
    out = []
    for t, g in enumerate(grads, start=1):
        bc1, bc2 = f32(1 - b1 ** t), f32(1 - b2 ** t)
        key = mix32(t)
        for i in range(len(w)):
            m = from_bits32(word[i] & 0xFFFF0000)
            v = from_bits32((word[i] << 16) & 0xFFFFFFFF)
            m = f32(f32(b1 * m) + f32(omb1 * g[i]))
            v = f32(f32(b2 * v) + f32(omb2 * f32(g[i] * g[i])))
            m_hat, v_hat = f32(m / bc1), f32(v / bc2)
            d = f32(f32(m_hat / f32(f32(math.sqrt(v_hat)) + eps)) + f32(wd * w[i]))
            h = mix32(mix32(mix32(bits32(w[i]) ^ key) ^ bits32(v)) ^ bits32(m))
            w[i] = f32(w[i] - f32(lr * d))
            word[i] = round_bf16_stochastic(m, h >> 16) | (round_bf16_stochastic(v, h) >> 16)
        out.append(list(w))
    return out


def sgd(hp, w, grads):
    lr, mu, wd, nesterov = hp["lr"], hp["momentum"], hp["weight_decay"], hp["nesterov"]
    buf = [0.0] * len(w)
    out = []
    for t, g in enumerate(grads, start=1):
        for i in range(len(w)):
            gd = g[i] + wd * w[i]
            buf[i] = gd if t == 1 else mu * buf[i] + gd
            d = gd + mu * buf[i] if nesterov else buf[i]
            w[i] = w[i] - lr * d
        out.append(list(w))
    return out


# How far from zero Lion's direction c must stay: float32 and double compute c with different
# roundings (about 1e-7 relative), and a sign that flipped between the two would make the golden
# value wrong, not the rule. The inputs are fixed, so this is checked once, when generating.
SIGN_MARGIN = 1e-4


def lion(hp, w, grads):
    lr, b1, b2, wd = hp["lr"], hp["beta1"], hp["beta2"], hp["weight_decay"]
    m = [0.0] * len(w)
    out = []
    for g in grads:
        for i in range(len(w)):
            c = b1 * m[i] + (1 - b1) * g[i]
            if abs(c) < SIGN_MARGIN:
                raise SystemExit(f"lion: direction {c} too close to 0 for a float32 rule to agree; change the inputs")
            sign = 1.0 if c > 0 else -1.0
            w[i] = w[i] - lr * (sign + wd * w[i])
            m[i] = b2 * m[i] + (1 - b2) * g[i]
        out.append(list(w))
    return out


# LAMB's tensors: the ELEMENTS cut into two, so that a rule taking one norm over all of them fails.
TENSORS = [5, 3]


def lamb(hp, w, grads):
    lr, b1, b2, eps, wd = hp["lr"], hp["beta1"], hp["beta2"], hp["eps"], hp["weight_decay"]
    lo, hi = hp["phi_min"], hp["phi_max"]
    m = [0.0] * len(w)
    v = [0.0] * len(w)
    out = []
    for t, g in enumerate(grads, start=1):
        r = [0.0] * len(w)
        for i in range(len(w)):
            m[i] = b1 * m[i] + (1 - b1) * g[i]
            v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i]
            m_hat = m[i] / (1 - b1 ** t)
            v_hat = v[i] / (1 - b2 ** t)
            r[i] = m_hat / (math.sqrt(v_hat) + eps) + wd * w[i]
        begin = 0
        for size in TENSORS:
            part = range(begin, begin + size)
            w_norm = math.sqrt(sum(w[i] * w[i] for i in part))
            r_norm = math.sqrt(sum(r[i] * r[i] for i in part))
            phi = min(max(w_norm, lo), hi)
            ratio = phi / r_norm if phi > 0 and r_norm > 0 else 1.0
            for i in part:
                w[i] = w[i] - lr * ratio * r[i]
            begin += size
        out.append(list(w))
    return out


def newton_schulz5(u, rows, cols):
    tall = rows > cols
    n, m = (cols, rows) if tall else (rows, cols)
    x = [[u[j * cols + i] if tall else u[i * cols + j] for j in range(m)] for i in range(n)]
    norm = math.sqrt(sum(v * v for row in x for v in row)) + 1e-7
    x = [[v / norm for v in row] for row in x]
    a, b, c = 3.4445, -4.7750, 2.0315
    for _ in range(5):
        A = [[sum(x[i][k] * x[j][k] for k in range(m)) for j in range(n)] for i in range(n)]
        B = [[b * A[i][j] + c * sum(A[i][k] * A[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
        x = [[a * x[i][j] + sum(B[i][k] * x[k][j] for k in range(n)) for j in range(m)] for i in range(n)]
    return [x[j][i] if tall else x[i][j] for i in range(rows) for j in range(cols)]


# Muon's cases: a matrix (wide in one case, tall in the other) and a 1-D tensor, which takes AdamW.
SHAPES = {"muon, Nesterov, wide": [(2, 3), (2,)], "muon, plain momentum, tall": [(3, 2), (2,)]}


def muon(hp, w, grads, shapes):
    lr, mu, wd, nesterov = hp["lr"], hp["momentum"], hp["weight_decay"], hp["nesterov"]
    adam = dict(lr=lr * hp["adamw_lr_scale"], beta1=hp["beta1"], beta2=hp["beta2"], eps=hp["eps"], weight_decay=wd)
    m = [0.0] * len(w)
    v = [0.0] * len(w)
    out = []
    for t, g in enumerate(grads, start=1):
        begin = 0
        for shape in shapes:
            size = math.prod(shape)
            part = range(begin, begin + size)
            if len(shape) == 2:
                for i in part:
                    m[i] = mu * m[i] + (1 - mu) * g[i]
                u = [(1 - mu) * g[i] + mu * m[i] if nesterov else m[i] for i in part]
                o = newton_schulz5(u, shape[0], shape[1])
                scale = math.sqrt(max(1.0, shape[0] / shape[1]))
                for k, i in enumerate(part):
                    w[i] = (1 - lr * wd) * w[i] - lr * scale * o[k]
            else:
                b1, b2 = adam["beta1"], adam["beta2"]
                for i in part:
                    m[i] = b1 * m[i] + (1 - b1) * g[i]
                    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i]
                    m_hat = m[i] / (1 - b1 ** t)
                    v_hat = v[i] / (1 - b2 ** t)
                    w[i] = w[i] - adam["lr"] * (m_hat / (math.sqrt(v_hat) + adam["eps"]) + wd * w[i])
            begin += size
        out.append(list(w))
    return out


# Adafactor's cases: a matrix (wide in one case, tall in the other) and a 1-D tensor.
SHAPES["adafactor, matrix and vector"] = [(2, 3), (2,)]
SHAPES["adafactor, tall, clipped update, eps floors"] = [(3, 2), (2,)]


def adafactor(hp, w, grads, shapes):
    lr, decay, eps1, eps2, d, wd = (hp[k] for k in ("lr", "beta2_decay", "eps1", "eps2", "d", "weight_decay"))
    state = [None] * len(shapes)
    out = []
    for t, g in enumerate(grads, start=1):
        beta = t ** decay
        rho = min(lr, 1 / math.sqrt(t))
        begin = 0
        for k, shape in enumerate(shapes):
            size = math.prod(shape)
            part = list(range(begin, begin + size))
            alpha = max(eps2, math.sqrt(sum(w[i] * w[i] for i in part) / size)) * rho
            for i in part:
                w[i] = (1 - lr * wd) * w[i]
            gs = [g[i] for i in part]
            if len(shape) == 2:
                rows, cols = shape
                if state[k] is None:
                    state[k] = ([0.0] * rows, [0.0] * cols)
                r, c = state[k]
                for i in range(rows):
                    mean = sum(gs[i * cols + j] ** 2 for j in range(cols)) / cols
                    r[i] = r[i] + beta * (mean - r[i])
                for j in range(cols):
                    mean = sum(gs[i * cols + j] ** 2 for i in range(rows)) / rows
                    c[j] = c[j] + beta * (mean - c[j])
                r_mean = max(sum(r) / rows, eps1)
                v = [r[i] * c[j] / r_mean for i in range(rows) for j in range(cols)]
            else:
                if state[k] is None:
                    state[k] = [0.0] * size
                s = state[k]
                for i in range(size):
                    s[i] = s[i] + beta * (gs[i] ** 2 - s[i])
                v = list(s)
            u = [gs[i] / math.sqrt(max(v[i], eps1 * eps1)) for i in range(size)]
            denom = max(1.0, math.sqrt(sum(x * x for x in u) / size) / d)
            for n, i in enumerate(part):
                w[i] = w[i] - alpha / denom * u[n]
            begin += size
        out.append(list(w))
    return out


SHAPED = {"muon", "adafactor"}  # rules whose cases name their tensors' shapes
BIT_EXACT = {"adamw_bf16"}  # rules emulated operation by operation in float32: their weights are the rule's bits
RULES = {"adamw": adamw, "adamw_bf16": adamw_bf16, "sgd": sgd, "lion": lion, "lamb": lamb, "muon": muon,
         "adafactor": adafactor}

# (optimizer, label, hyper-parameters): every setting of the optimizer, by the names its
# hyper_parameters() lists. Large rates and decays, so that a formula that drifts (coupled instead of
# decoupled decay, a missing bias correction, dampening, a wrong first step) moves the weights by far
# more than float32 rounding does.
CASES = [
    ("adamw", "defaults except lr and decay", dict(lr=0.05, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)),
    ("adamw", "small betas, large eps", dict(lr=0.02, beta1=0.5, beta2=0.75, eps=0.1, weight_decay=0.0)),
    ("sgd", "plain", dict(lr=0.1, momentum=0.0, weight_decay=0.0, nesterov=False)),
    ("sgd", "momentum and weight decay", dict(lr=0.1, momentum=0.9, weight_decay=0.05, nesterov=False)),
    ("sgd", "Nesterov momentum and weight decay", dict(lr=0.05, momentum=0.8, weight_decay=0.1, nesterov=True)),
    ("lion", "default betas, no decay", dict(lr=0.05, beta1=0.9, beta2=0.99, weight_decay=0.0)),
    ("lion", "other betas and decoupled decay", dict(lr=0.02, beta1=0.5, beta2=0.8, weight_decay=0.5)),
    ("lamb", "defaults except lr and decay, no clamp reached",
     dict(lr=0.05, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.1, phi_min=0.0, phi_max=10.0)),
    ("lamb", "small betas, ||w|| clamped from below and above",
     dict(lr=0.02, beta1=0.5, beta2=0.75, eps=0.1, weight_decay=0.0, phi_min=1.5, phi_max=2.0)),
    ("muon", "muon, Nesterov, wide",
     dict(lr=0.05, momentum=0.9, weight_decay=0.1, nesterov=True, adamw_lr_scale=0.5, beta1=0.9, beta2=0.95,
          eps=1e-8)),
    ("muon", "muon, plain momentum, tall",
     dict(lr=0.1, momentum=0.5, weight_decay=0.0, nesterov=False, adamw_lr_scale=0.2, beta1=0.5, beta2=0.75,
          eps=0.1)),
    ("adamw_bf16", "defaults except lr and decay",
     dict(lr=0.05, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1)),
    ("adamw_bf16", "small betas, large eps", dict(lr=0.02, beta1=0.5, beta2=0.75, eps=0.1, weight_decay=0.0)),
    # rho = lr in the first steps, 1 / sqrt(t) from step 5; RMS(W) above eps2.
    ("adafactor", "adafactor, matrix and vector",
     dict(lr=0.5, beta2_decay=-0.8, eps1=1.1920929e-07, eps2=1e-3, d=1.0, weight_decay=0.1)),
    # alpha from eps2, the statistics floored by eps1, the update's RMS clipped by d.
    ("adafactor", "adafactor, tall, clipped update, eps floors",
     dict(lr=0.05, beta2_decay=-0.5, eps1=0.1, eps2=2.0, d=0.5, weight_decay=0.0)),
]


def inputs(seed):
    rng = Rng(seed)
    w = [f32(rng.uniform(-1.5, 1.5)) for _ in range(ELEMENTS)]
    grads = []
    for _ in range(STEPS):
        g = []
        for _ in range(ELEMENTS):
            x = rng.uniform(0.05, 1.0) * (1 if rng.uniform(0, 1) < 0.5 else -1)
            g.append(f32(x))
        grads.append(g)
    return w, grads


def cpp_float(x):
    return f"{x.hex()}f" if x != 0 else "0.0f"


def cpp_double(x):
    return x.hex() if x != 0 else "0.0"


def generate():
    lines = [
        "// Generated by tests/core/optimizer_golden.py from the published update equations in double precision; do not edit.",
        "#pragma once",
        "",
        "#include <vector>",
        "",
        "namespace golden {",
        "",
        "struct setting {",
        "  const char* name;",
        "  double value;  // a bool as 0 or 1; a float setting is the float nearest to it",
        "};",
        "struct optimizer_case {",
        "  const char* optimizer;",
        "  const char* label;",
        "  std::vector<setting> settings;",
        "  std::vector<float> w0;                    // the weights before step 1",
        "  std::vector<std::vector<float>> grads;     // [step][element], the averaged gradient",
        "  std::vector<std::vector<double>> weights;  // [step][element], after that step",
        "  std::vector<int> tensors;                  // a tensor-wise optimizer's tensors (sizes, in order)",
        "  std::vector<std::vector<int>> shapes;      // a matrix optimizer's tensors (shapes, in order)",
        "  bool bits = false;                         // the weights are the float32 rule's bits, to compare exactly",
        "};",
        "",
        "inline const std::vector<optimizer_case>& cases() {",
        "  static const std::vector<optimizer_case> all = {",
    ]
    for n, (opt, label, hp) in enumerate(CASES):
        # The C++ side holds each float setting as a float: compute with exactly that value.
        used = {k: (v if isinstance(v, bool) else f32(v)) for k, v in hp.items()}
        w0, grads = inputs(1000 + n)
        if opt in SHAPED:
            weights = RULES[opt](used, list(w0), grads, SHAPES[label])
        else:
            weights = RULES[opt](used, list(w0), grads)
        settings = ", ".join(f'{{"{k}", {cpp_double(float(v))}}}' for k, v in used.items())
        lines.append(f'      {{"{opt}", "{label}", {{{settings}}},')
        lines.append("       {" + ", ".join(cpp_float(x) for x in w0) + "},")
        lines.append("       {" + ", ".join("{" + ", ".join(cpp_float(x) for x in g) + "}" for g in grads) + "},")
        lines.append("       {" + ", ".join("{" + ", ".join(cpp_double(x) for x in s) + "}" for s in weights) + "},")
        lines.append("       {" + (", ".join(str(x) for x in TENSORS) if opt == "lamb" else "") + "},")
        shapes = SHAPES.get(label, []) if opt in SHAPED else []
        lines.append("       {" + ", ".join("{" + ", ".join(str(d) for d in sh) + "}" for sh in shapes) + "}"
                     + (", true}," if opt in BIT_EXACT else "},"))
    lines += ["  };", "  return all;", "}", "", "}  // namespace golden", ""]
    return "\n".join(lines)


def main():
    target = pathlib.Path(__file__).resolve().parent / "optimizer_golden.hpp"
    text = generate()
    if "--check" in sys.argv[1:]:
        if not target.exists() or target.read_text() != text:
            print(f"{target} is not what {pathlib.Path(__file__).name} produces; run it to regenerate")
            return 1
        print(f"{target.name} matches the equations ({len(CASES)} cases)")
        return 0
    target.write_text(text)
    print(f"wrote {target} ({len(CASES)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
