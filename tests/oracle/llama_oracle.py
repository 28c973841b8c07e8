#!/usr/bin/env python3
"""An independent float64 PyTorch reference for tessera's Llama-style decoder: it
writes the weights, a batch, and the logits, loss and gradients the C++ test
(tests/nn) must reproduce. Plain torch ops only; no HF transformers.

  python3 tests/oracle/llama_oracle.py write OUT.safetensors
      Draws the weights and batch, runs forward + backward, writes the file.
  python3 tests/oracle/llama_oracle.py check FILE.safetensors
      Recomputes and asserts the file holds the same f32 weights and batch
      (bitwise) and the same f64 results (within 1e-12); prints one "OK ..." line.

The golden tests/nn/golden/llama_golden.safetensors was made with
  python3 tests/oracle/llama_oracle.py write tests/nn/golden/llama_golden.safetensors
(torch 2.15.0+cu132 on CPU, safetensors 0.8.0; numpy 2.4.6 installed, not used).

Conventions (Meta's Llama reference, torchtitan names, no biases, output not tied):
  h = tok_embeddings[idx]; per layer h += attention(attention_norm(h)),
  h += feed_forward(ffn_norm(h)); logits = output(norm(h));
  loss = mean cross-entropy over the B*T positions.
  RMSNorm(x) = x * rsqrt(mean(x^2, last dim) + norm_eps) * weight.
  Rotary embedding on q and k with INTERLEAVED pairs (2i, 2i+1), positions from 0:
    angle = t * rope_theta^(-2i/D), i in [0, D/2)
    out[2i] = x[2i] cos - x[2i+1] sin;  out[2i+1] = x[2i] sin + x[2i+1] cos
  (computed as Meta does with view_as_complex, and checked against cos/sin).
  Grouped-query attention: k and v are repeat_interleave'd n_head / n_kv_head
  times on the head dim, so query head j reads kv head j // n_rep; causal
  softmax with scale 1/sqrt(D).
  SwiGLU feed-forward: w2(silu(w1(x)) * w3(x)).
  Weights are drawn in float32 (stored as F32) and cast to float64; forward and
  backward run entirely in float64 autograd, RoPE angles included.

Tensors: param.<name> F32, batch.idx / batch.targets I64 [B, T], logits F64
[B, T, V], loss F64 0-d, grad.<name> F64 (d loss / d param). Metadata holds the
config, "producer" and the torch and safetensors versions, keys sorted so that
re-running write gives identical bytes.
"""
import json
import math
import sys

import safetensors
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save

CONFIG = {"vocab_size": 32, "n_embd": 16, "n_layer": 2, "n_head": 4, "n_kv_head": 2, "ffn_hidden": 48,
          "rope_theta": 10000.0, "norm_eps": 1e-5, "block_size": 16, "batch": 2, "seq_len": 8}
SEED = 20240611
WEIGHT_STD = 0.3  # large enough that logits and gradients are far from trivial
PRODUCER = "tests/oracle/llama_oracle.py"
TOLERANCE = 1e-12


def param_shapes(c):
    """name -> shape, in the order the weights are drawn."""
    C, V, F_ = c["n_embd"], c["vocab_size"], c["ffn_hidden"]
    D = C // c["n_head"]
    shapes = {"tok_embeddings.weight": (V, C)}
    for i in range(c["n_layer"]):
        p = f"layers.{i}."
        shapes.update({p + "attention_norm.weight": (C,),
                       p + "attention.wq.weight": (c["n_head"] * D, C),
                       p + "attention.wk.weight": (c["n_kv_head"] * D, C),
                       p + "attention.wv.weight": (c["n_kv_head"] * D, C),
                       p + "attention.wo.weight": (C, c["n_head"] * D),
                       p + "ffn_norm.weight": (C,),
                       p + "feed_forward.w1.weight": (F_, C),
                       p + "feed_forward.w2.weight": (C, F_),
                       p + "feed_forward.w3.weight": (F_, C)})
    shapes.update({"norm.weight": (C,), "output.weight": (V, C)})
    return shapes


def make_inputs(c):
    """f32 weights and the int64 batch, all drawn from one seeded generator."""
    gen = torch.Generator().manual_seed(SEED)
    params = {}
    for name, shape in param_shapes(c).items():
        noise = torch.randn(shape, generator=gen, dtype=torch.float32)
        params[name] = 1 + 0.1 * noise if name.endswith("norm.weight") else WEIGHT_STD * noise
    batch_shape = (c["batch"], c["seq_len"])
    idx = torch.randint(0, c["vocab_size"], batch_shape, generator=gen, dtype=torch.int64)
    targets = torch.randint(0, c["vocab_size"], batch_shape, generator=gen, dtype=torch.int64)
    return params, idx, targets


def rope_freqs_cis(head_dim, end, theta):
    """[end, D/2] complex128 e^(i t theta^(-2i/D)): Meta's precompute_freqs_cis, in f64."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(end, dtype=torch.float64), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def rope_complex(x, freqs_cis):
    """x: [B, T, H, D]; pair (2i, 2i+1) is one complex number, rotated by freqs_cis[t, i]."""
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))  # [B, T, H, D/2]
    return torch.view_as_real(pairs * freqs_cis[None, :, None, :]).flatten(3)


def rope_cos_sin(x, theta):
    """The same rotation written out with cos and sin, exactly as the docstring states it."""
    _, T, _, D = x.shape
    i = torch.arange(D // 2, dtype=torch.float64)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta ** (-2 * i / D)  # [T, D/2]
    cos, sin = angle.cos()[None, :, None, :], angle.sin()[None, :, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(3)


def check_rope(c):
    """Both RoPE formulations agree on every position up to block_size."""
    D = c["n_embd"] // c["n_head"]
    x = torch.randn(c["batch"], c["block_size"], c["n_head"], D, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(SEED + 1))
    freqs_cis = rope_freqs_cis(D, c["block_size"], c["rope_theta"])
    diff = (rope_complex(x, freqs_cis) - rope_cos_sin(x, c["rope_theta"])).abs().max().item()
    assert diff < TOLERANCE, f"rope: complex and cos/sin forms differ by {diff}"


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def attention(x, p, prefix, freqs_cis, c):
    B, T, C = x.shape
    H, Hkv = c["n_head"], c["n_kv_head"]
    D = C // H
    q = F.linear(x, p[prefix + "wq.weight"]).view(B, T, H, D)
    k = F.linear(x, p[prefix + "wk.weight"]).view(B, T, Hkv, D)
    v = F.linear(x, p[prefix + "wv.weight"]).view(B, T, Hkv, D)
    q, k = rope_complex(q, freqs_cis), rope_complex(k, freqs_cis)
    # query head j reads kv head j // n_rep
    k, v = k.repeat_interleave(H // Hkv, dim=2), v.repeat_interleave(H // Hkv, dim=2)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, T, D]
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # [B, H, T, T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    out = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v  # [B, H, T, D]
    return F.linear(out.transpose(1, 2).reshape(B, T, H * D), p[prefix + "wo.weight"])


def feed_forward(x, p, prefix):
    gate = F.silu(F.linear(x, p[prefix + "w1.weight"]))
    return F.linear(gate * F.linear(x, p[prefix + "w3.weight"]), p[prefix + "w2.weight"])


def forward(p, idx, c):
    """idx: [B, T] -> logits [B, T, V]."""
    T, eps = idx.shape[1], c["norm_eps"]
    # the table is built for block_size and sliced, so positions start at 0 for T < block_size
    freqs_cis = rope_freqs_cis(c["n_embd"] // c["n_head"], c["block_size"], c["rope_theta"])[:T]
    h = F.embedding(idx, p["tok_embeddings.weight"])  # [B, T, C]
    for i in range(c["n_layer"]):
        layer = f"layers.{i}."
        h = h + attention(rms_norm(h, p[layer + "attention_norm.weight"], eps), p, layer + "attention.", freqs_cis, c)
        h = h + feed_forward(rms_norm(h, p[layer + "ffn_norm.weight"], eps), p, layer + "feed_forward.")
    return F.linear(rms_norm(h, p["norm.weight"], eps), p["output.weight"])


def compute(c):
    """Every tensor the golden file holds, name -> tensor, freshly computed."""
    torch.set_num_threads(1)  # one reduction order, so re-running gives identical bytes
    check_rope(c)
    params, idx, targets = make_inputs(c)
    p64 = {name: w.double().requires_grad_() for name, w in params.items()}
    logits = forward(p64, idx, c)
    loss = F.cross_entropy(logits.view(-1, c["vocab_size"]), targets.view(-1))
    loss.backward()
    tensors = {"param." + name: w for name, w in params.items()}
    tensors.update({"batch.idx": idx, "batch.targets": targets, "logits": logits.detach(), "loss": loss.detach()})
    tensors.update({"grad." + name: w.grad for name, w in p64.items()})
    check_not_degenerate(tensors, c)
    return tensors


def check_not_degenerate(tensors, c):
    loss, uniform = tensors["loss"].item(), math.log(c["vocab_size"])
    print(f"loss {loss:.6f} (log V = {uniform:.6f})")
    assert abs(loss - uniform) > 0.05, f"loss {loss} is within 0.05 of log(V) = {uniform}"
    for name, t in tensors.items():
        assert not name.startswith("grad.") or t.norm() > 0, f"{name}: gradient is all zero"


def metadata(c):
    fields = {key: str(value) for key, value in c.items()}
    return {**fields, "producer": PRODUCER, "torch_version": torch.__version__,
            "safetensors_version": safetensors.__version__}


def save_sorted(tensors, path, meta):
    """safetensors.torch.save_file, but with the metadata keys sorted: safetensors keeps
    them in a Rust HashMap, whose order changes from run to run."""
    raw = save(tensors, metadata=meta)
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)  # same text reordered: same length
    assert len(text) == n, f"header: {len(text)} bytes after sorting, expected {n}"
    with open(path, "wb") as file:
        file.write(raw[:8] + text + raw[8 + n:])


def write(path):
    tensors = compute(CONFIG)
    save_sorted(tensors, path, metadata(CONFIG))
    print(f"wrote {path}: {len(tensors)} tensors")


def check(path):
    want = compute(CONFIG)
    got = load_file(path)
    assert sorted(got) == sorted(want), f"names {sorted(got)}, expected {sorted(want)}"
    worst = 0.0
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype and g.shape == w.shape, \
            f"{name}: {g.dtype} {list(g.shape)}, expected {w.dtype} {list(w.shape)}"
        if w.dtype == torch.float64:
            diff = (g - w).abs().max().item()
            assert diff <= TOLERANCE, f"{name}: differs by {diff}, tolerance {TOLERANCE}"
            worst = max(worst, diff)
        else:
            assert torch.equal(g, w), f"{name}: values differ from a fresh draw"
    with safe_open(path, framework="pt") as opened:
        stored = opened.metadata()
    expected = metadata(CONFIG)
    for key in [*CONFIG, "producer"]:  # versions may differ on another machine; the config must not
        assert stored.get(key) == expected[key], f"metadata {key}: {stored.get(key)}, expected {expected[key]}"
    print(f"OK {path}: {len(want)} tensors; f32/i64 bitwise, f64 max diff {worst:.3g}; "
          f"written with torch {stored['torch_version']}, checked with torch {torch.__version__}")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        sys.exit(__doc__)
    write(sys.argv[2]) if sys.argv[1] == "write" else check(sys.argv[2])


if __name__ == "__main__":
    main()
