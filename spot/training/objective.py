"""SDAR's block-diffusion training objective (SDAR / MDLM), and its value on held-out batches.

A window x_0 of L tokens (L/B blocks of B) is fed as [x_t ; x_0] (length 2L, positions arange(L) twice). x_t masks
each token of block k with probability t_k ~ U(eps, 1) (at least one per block). Attention (additive bias, 0 / -inf):
  noisy block k -> itself (bidirectional) and the CLEAN blocks < k;  clean block k -> clean blocks <= k.
Loss = sum over masked positions of CE(x_0) / t_k, divided by the number of tokens N*L (or, without ELBO weighting,
the plain mean CE over masked tokens). eps = 1/B: below one expected mask per block the forced single mask would
carry weights up to 1/eps.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from spot.reference.model import SDARModel
from spot.training.batch import Batch

NEG_INF = float("-inf")


# -- the objective -----------------------------------------------------------------------------
def diffusion_bias(seq_len: int, block_size: int) -> torch.Tensor:
    """Additive attention bias [2L, 2L] for [x_t ; x_0] (SDAR's training mask, see module docstring)."""
    blk = torch.arange(seq_len) // block_size
    q, k = blk[:, None], blk[None, :]
    noisy_noisy = q == k
    noisy_clean = k < q
    clean_clean = k <= q
    clean_noisy = torch.zeros_like(noisy_noisy)
    allowed = torch.cat([torch.cat([noisy_noisy, noisy_clean], 1), torch.cat([clean_noisy, clean_clean], 1)], 0)
    return torch.zeros(allowed.shape).masked_fill(~allowed, NEG_INF)


def mask_blocks(x0: torch.Tensor, block_size: int, mask_id: int, gen: torch.Generator,
                eps: float, ratio: float | None = None, eligible: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x0 [N,L] int64 -> (x_t [N,L], masked [N,L] bool, t [N,L] float: the block's mask ratio per token).

    ratio None draws t ~ U(eps, 1) per block; a number fixes it (evaluation). At least one mask per block that
    has a maskable position. eligible [N,L] bool: the positions that may be masked (None: all; the arithmetic
    corpus never masks the prompt)."""
    n, length = x0.shape
    nb = length // block_size
    if ratio is None:
        t = eps + (1.0 - eps) * torch.rand(n, nb, generator=gen)
    else:
        t = torch.full((n, nb), float(ratio))
    t_tok = t.repeat_interleave(block_size, dim=1)
    masked = torch.rand(n, length, generator=gen) < t_tok
    if eligible is None:
        # force one mask in blocks that drew none (a block with nothing to predict teaches nothing)
        forced = torch.randint(0, block_size, (n, nb), generator=gen) + torch.arange(nb) * block_size
        none = ~masked.view(n, nb, block_size).any(-1)
        masked[torch.arange(n)[:, None].expand(n, nb)[none], forced[none]] = True
    else:
        masked &= eligible
        # the forced mask of an empty block: a uniformly drawn eligible position of it
        score = torch.rand(n, length, generator=gen).masked_fill(~eligible, -1.0).view(n, nb, block_size)
        pick = score.argmax(-1) + torch.arange(nb) * block_size
        none = ~masked.view(n, nb, block_size).any(-1) & eligible.view(n, nb, block_size).any(-1)
        masked[torch.arange(n)[:, None].expand(n, nb)[none], pick[none]] = True
    return x0.masked_fill(masked, mask_id), masked, t_tok


def diffusion_loss(model: SDARModel, x0: torch.Tensor, bias: torch.Tensor, gen: torch.Generator, eps: float,
                   ratio: float | None = None, eligible: torch.Tensor | None = None, elbo: bool = True,
                   weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(training loss,  plain mean CE over masked tokens). elbo: the loss is sum CE/t over masked / maskable tokens
    (MDLM's bound); else the plain mean — heavily masked blocks, where a token cannot be read off a neighbour and
    must be looked up in the context, then weigh as much per token as lightly masked ones (1/t gives them the least).
    weight [N,L] (plain mean only): each masked token's weight, the loss their weighted mean.

    The LM head runs only on masked positions of x_t: the other outputs are never scored."""
    cfg = model.cfg
    n, length = x0.shape
    xt, masked, t_tok = mask_blocks(x0, cfg.block_size, cfg.mask_token_id, gen, eps, ratio, eligible)
    positions = torch.arange(length).repeat(2)
    hidden, _, _ = model(torch.cat([xt, x0], 1), positions, bias, return_hidden=True)
    h = hidden[:, :length][masked]                       # [M, H]
    ce = F.cross_entropy(model.lm_head(h).float(), x0[masked], reduction="none")
    if not elbo:
        if weight is None:
            return ce.mean(), ce.mean()
        w = weight[masked].to(ce.dtype)
        return (ce * w).sum() / w.sum(), ce.mean()
    if weight is not None:
        raise ValueError("token weights are defined for the plain mean (elbo=False) only")
    maskable = n * length if eligible is None else max(int(eligible.sum()), 1)
    return (ce / t_tok[masked]).sum() / maskable, ce.mean()


# -- evaluation during training -------------------------------------------------------------------------------
@torch.no_grad()
def heldout_loss(model: SDARModel, batches: list[Batch], ratio: float, seed: int = 1234) -> float:
    """Mean CE (nats/token) over masked tokens of held-out batches at a fixed mask ratio."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    total, count = 0.0, 0
    cfg = model.cfg
    for b in batches:
        x0 = torch.from_numpy(b.x0)
        eligible = None if b.eligible is None else torch.from_numpy(b.eligible)
        xt, masked, _ = mask_blocks(x0, cfg.block_size, cfg.mask_token_id, gen, 0.0, ratio, eligible)
        positions = torch.arange(x0.shape[1]).repeat(2)
        hidden, _, _ = model(torch.cat([xt, x0], 1), positions, diffusion_bias(x0.shape[1], cfg.block_size),
                             return_hidden=True)
        ce = F.cross_entropy(model.lm_head(hidden[:, :x0.shape[1]][masked]).float(), x0[masked], reduction="sum")
        total += float(ce)
        count += int(masked.sum())
    model.train()
    return total / max(count, 1)
