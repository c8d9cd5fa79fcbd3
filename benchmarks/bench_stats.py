"""Peers of `inspect --stats` (strings only: the driver never imports torch or numpy).

- the read-once floor: ``cat FILE > /dev/null`` (every byte out of the page cache once, no
  arithmetic): the target is `inspect --stats` within 3x of it;
- what a user writes instead: ``safe_open`` (or ``torch.load(mmap=True)``) and, per tensor, a
  float64 cast then min / max / mean / std / NaN count with numpy (torch).

Each peer prints the number of tensors it read last, as the listing peers do.
"""
from __future__ import annotations

CAT = ["sh", "-c", 'cat "$0" > /dev/null; echo 0']

ST_STATS = """
import sys, numpy as np
from safetensors import safe_open
n = 0
with safe_open(sys.argv[1], framework="np") as f:
    for k in f.keys():
        x = f.get_tensor(k).astype(np.float64)
        (x.min(), x.max(), x.mean(), x.std(), int(np.isnan(x).sum()))
        n += 1
print(n)
"""

TORCH_STATS = """
import sys, torch
sd = torch.load(sys.argv[1], mmap=True, weights_only=True)
for v in sd.values():
    x = v.double()
    (x.min().item(), x.max().item(), x.mean().item(), x.std(unbiased=False).item(), int(x.isnan().sum()))
print(len(sd))
"""
