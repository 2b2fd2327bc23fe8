"""The ct-nodule network in torch (build time only: this module imports torch at import time).

Conv stem (four stride-2 3x3 convolutions, 256 -> 16) feeding a small pre-LN transformer over the 16x16
tokens. Per-token logits form the localisation map; the slice logit is the map's maximum plus a linear read of
max-pooled token features. Attention is written out (MatMul + Softmax), so the ONNX export contains plain
MatMuls that INT4 weight-only quantization covers, and no fused attention op.

Attention logits are clamped to [-cap, cap] (cap 30, an ONNX ``Clip``) before the Softmax. The spread of a
row is then at most 60, so ``exp`` never yields subnormal probabilities (exp(-87) is the float32 normal
limit). Unbounded logits in a trained model produced subnormals that made Softmax and the following MatMul
several times slower on CPU (see ``models/ct-nodule/README.md``). Activations are ReLU (cheap, fuses with
Conv in ONNX Runtime, exact zeros).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

__all__ = ["Exported", "NetConfig", "NoduleNet"]


@dataclass(frozen=True)
class NetConfig:
    """Architecture hyper-parameters."""

    image: int = 256  # input H = W
    stem: tuple[int, ...] = (16, 32, 64)  # channels of the first three stride-2 convs; the fourth gives dim
    dim: int = 128  # token width (a multiple of every INT4 block size tried)
    depth: int = 2  # transformer blocks
    heads: int = 4
    mlp: int = 256  # MLP hidden width
    logit_cap: float = 30.0  # attention logits are clamped to [-cap, cap] (0 disables)

    @property
    def grid(self) -> int:
        """Tokens per side: image / 16."""
        return self.image // 16

    def as_dict(self) -> dict[str, object]:
        """The config as plain data (for the manifest)."""
        d = asdict(self)
        d["stem"] = list(self.stem)
        return d


class _Block(nn.Module):
    def __init__(self, cfg: NetConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.cap = cfg.logit_cap
        self.scale = (cfg.dim // cfg.heads) ** -0.5
        self.ln1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.ln2 = nn.LayerNorm(cfg.dim)
        self.fc1 = nn.Linear(cfg.dim, cfg.mlp)
        self.fc2 = nn.Linear(cfg.mlp, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h = self.heads
        qkv = self.qkv(self.ln1(x)).reshape(b, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = (q * self.scale) @ k.transpose(-2, -1)
        if self.cap > 0:
            att = att.clamp(-self.cap, self.cap)
        att = att.softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, n, d)
        x = x + self.proj(y)
        return x + self.fc2(nn.functional.relu(self.fc1(self.ln2(x))))


class NoduleNet(nn.Module):
    """Conv-stem ViT: image [B, 1, H, W] in [0, 1] -> (slice logit [B, 1], patch logits [B, H/16, W/16])."""

    def __init__(self, cfg: NetConfig) -> None:
        super().__init__()
        self.cfg = cfg
        chans = (1, *cfg.stem, cfg.dim)
        layers: list[nn.Module] = []
        for i in range(4):
            layers.append(nn.Conv2d(chans[i], chans[i + 1], 3, stride=2, padding=1, bias=False))
            layers.append(nn.BatchNorm2d(chans[i + 1]))
            if i < 3:
                layers.append(nn.ReLU())
        self.stem = nn.Sequential(*layers)
        self.pos = nn.Parameter(torch.zeros(1, cfg.grid * cfg.grid, cfg.dim))
        nn.init.trunc_normal_(self.pos, std=0.02)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(cfg.dim)
        self.patch_head = nn.Linear(cfg.dim, 1)
        self.slice_head = nn.Linear(cfg.dim, 1)
        nn.init.constant_(self.patch_head.bias, -4.0)  # nodule cells are rare: start near their prior

    def forward(
        self, x: torch.Tensor, offsets: list[tuple[int, int]] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (slice logit [B, 1], patch logits [B, h, w]) for ``x`` [B, 1, 16h, 16w].

        ``x`` may hold crops of full inputs (training): ``offsets`` gives each crop's top-left cell, and each
        crop gets the matching part of the positional embedding.
        """
        f = self.stem(x - 0.5)
        h, w = f.shape[-2:]
        pos = self.pos
        if offsets is not None:
            g = self.cfg.grid
            grid = pos.reshape(g, g, -1)
            pos = torch.stack([grid[r:r + h, c:c + w].reshape(h * w, -1) for r, c in offsets])
        t = f.flatten(2).transpose(1, 2) + pos
        for blk in self.blocks:
            t = blk(t)
        t = self.norm(t)
        patch = self.patch_head(t).squeeze(-1)  # [B, g*g]
        slice_logit = patch.amax(dim=1, keepdim=True) + self.slice_head(t.amax(dim=1))
        return slice_logit, patch.reshape(-1, h, w)


class Exported(nn.Module):
    """The served graph: probabilities, with the sigmoids inside."""

    def __init__(self, net: NoduleNet) -> None:
        super().__init__()
        self.net = net

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (prob [B, 1], heatmap [B, g, g])."""
        s, p = self.net(image)
        return torch.sigmoid(s), torch.sigmoid(p)
