"""Drawing a memento mask (attention-gym style) and the KV accounting it implies."""

from __future__ import annotations

from pathlib import Path

import torch

from .tokens import ANSWER, BLOCK, BLOCK_TAG, GAP, MEMENTO, MEMENTO_TAG, PROMPT, ROLES, THINK

ROLE_COLORS = {
    PROMPT: "#4c72b0",
    THINK: "#8172b3",
    BLOCK: "#dd8452",
    BLOCK_TAG: "#c44e52",
    GAP: "#937860",
    MEMENTO: "#55a868",
    MEMENTO_TAG: "#2d6a3e",
    ANSWER: "#da8bc3",
}


def kv_accounting(mask: torch.Tensor) -> dict[str, float]:
    """KV entries held while computing each query of one document: full cache vs eviction.

    Row q of the mask is the set of keys that query q attends; with eviction the cache holds
    exactly those, without it all q + 1 earlier tokens.
    """
    if mask.dim() != 2 or mask.shape[0] != mask.shape[1]:
        raise ValueError(f"expected one [S, S] mask, got shape {tuple(mask.shape)}")
    held = mask.sum(-1).double()
    full = torch.arange(1, mask.shape[0] + 1, dtype=torch.float64)
    peak_full, peak_memento = float(full.max()), float(held.max())
    return {
        "tokens": int(mask.shape[0]),
        "peak_kv_full": int(peak_full),
        "peak_kv_memento": int(peak_memento),
        "peak_kv_ratio": peak_memento / peak_full,
        "kv_auc_full": float(full.sum()),
        "kv_auc_memento": float(held.sum()),
        "auc_ratio": float(held.sum() / full.sum()),
    }


def draw_mask(
    mask: torch.Tensor,
    path: str | Path,
    roles: list[str] | None = None,
    title: str = "",
    max_pixels: int = 1600,
) -> Path:
    """Save a PNG of a [S, S] mask: visible cells coloured by the key's role, hidden cells white,
    with a role strip along both axes. Large masks are max-pooled to at most `max_pixels`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    size = mask.shape[-1]
    role_list = roles or [BLOCK] * size
    role_index = torch.tensor([ROLES.index(r) + 1 for r in role_list], dtype=torch.float32)
    image = mask.float() * role_index[None, :]  # 0 = hidden, else 1 + role of the key column
    stride = max(1, -(-size // max_pixels))
    if stride > 1:
        image = torch.nn.functional.max_pool2d(image[None, None], stride, ceil_mode=True)[0, 0]
        strip = torch.nn.functional.max_pool1d(role_index[None, None], stride, ceil_mode=True)[0, 0]
    else:
        strip = role_index
    colors = ["#ffffff", *[ROLE_COLORS[r] for r in ROLES]]
    cmap = ListedColormap(colors)
    fig = plt.figure(figsize=(9, 9.6))
    grid = fig.add_gridspec(2, 2, width_ratios=[1, 30], height_ratios=[1, 30], wspace=0.02, hspace=0.02)
    top, left, main = fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    kwargs = {"cmap": cmap, "vmin": 0, "vmax": len(ROLES), "interpolation": "nearest", "aspect": "auto"}
    main.imshow(image.numpy(), **kwargs)
    top.imshow(strip[None, :].numpy(), **kwargs)
    left.imshow(strip[:, None].numpy(), **kwargs)
    for ax in (top, left):
        ax.set_xticks([])
        ax.set_yticks([])
    main.set_xlabel("key position (cached token)" + (f", 1 px = {stride} tokens" if stride > 1 else ""))
    main.set_ylabel("query position")
    main.yaxis.set_label_position("right")
    main.yaxis.tick_right()
    present = [r for r in ROLES if r in set(role_list)]
    main.legend(
        handles=[Patch(color=ROLE_COLORS[r], label=r) for r in present],
        loc="upper right",
        fontsize=8,
        framealpha=0.9,
    )
    if title:
        top.set_title(title, fontsize=10)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out
