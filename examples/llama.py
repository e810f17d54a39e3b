"""A small LLaMA in the shape of Meta's reference model: RMSNorm, SwiGLU feed-forward, causal attention, and
rotary position embeddings applied as complex products (polar, view_as_complex, view_as_real).

Written for this project after the reference's structure (not copied). `make_llama(lib)` builds it on any
torch-like library, so the same model runs on runtime and, as an oracle, on torch:

    import runtime, nnc
    from llama import make_llama
    model = nnc.compile(make_llama(runtime))
    loss = model(tokens, targets); loss.backward()
"""


def make_llama(lib, vocab=40, dim=16, heads=2, layers=2, max_len=16, upcast=True):
    """A small LLaMA in the shape of Meta's reference: RMSNorm, SwiGLU, causal attention, and rotary embeddings as
    complex products with a precomputed complex buffer (polar, view_as_complex, view_as_real), in float32 as the
    reference computes them (`upcast`) or in the model's dtype."""
    nn, F = lib.nn, lib.nn.functional

    def rotations(head_dim, length, theta=10000.0):
        inverse = 1.0 / theta ** (lib.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim)
        angles = lib.outer(lib.arange(length).float(), inverse)
        return lib.polar(lib.ones_like(angles), angles)

    def rotate(x, rot):
        pairs = lib.view_as_complex((x.float() if upcast else x).reshape(*x.shape[:-1], -1, 2))
        return lib.view_as_real(pairs * rot.view(1, x.shape[1], 1, -1)).flatten(3).type_as(x)

    class RMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(lib.ones(d))

        def forward(self, x):
            return x * lib.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
            self.v, self.o = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)

        def forward(self, x, rot):
            b, t, _ = x.shape
            q, k, v = (f(x).view(b, t, heads, dim // heads) for f in (self.q, self.k, self.v))
            q, k = rotate(q, rot), rotate(k, rot)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True)
            return self.o(y.transpose(1, 2).reshape(b, t, dim))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.attention, self.norm2 = RMSNorm(dim), Attention(), RMSNorm(dim)
            self.w1, self.w3 = nn.Linear(dim, 2 * dim, bias=False), nn.Linear(dim, 2 * dim, bias=False)
            self.w2 = nn.Linear(2 * dim, dim, bias=False)

        def forward(self, x, rot):
            x = x + self.attention(self.norm1(x), rot)
            h = self.norm2(x)
            return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, dim)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm, self.head = RMSNorm(dim), nn.Linear(dim, vocab, bias=False)
            self.rot = rotations(dim // heads, max_len)  # a plain attribute, as in the reference

        def forward(self, tokens, targets):
            x, rot = self.embed(tokens), self.rot[: tokens.shape[1]]
            for block in self.blocks:
                x = block(x, rot)
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.view(-1, vocab), targets.view(-1))

    return Llama()
