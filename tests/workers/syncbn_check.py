"""Worker for tests/test_syncbn.py: synchronised BN vs BN on the whole global batch (--sizes 3,5)."""
import argparse

import torch.distributed as dist

from helpers.syncbn import check_against_full_batch
from helpers.worker import finish, report, start

parser = argparse.ArgumentParser()
parser.add_argument("--sizes", required=True)  # per-rank batch sizes
parser.add_argument("--dims", type=int, default=4)
parser.add_argument("--tol", type=float, default=1e-4)
args = parser.parse_args()

start()  # gloo on CPU, NCCL with one GPU per rank
sizes = [int(s) for s in args.sizes.split(",")]
worst = check_against_full_batch(sizes, dims=args.dims)
rank = dist.get_rank() if dist.is_initialized() else 0
for name, diff in worst.items():
    print(f"{name:13s} max|diff| {diff:.1e}  {'OK' if diff < args.tol else 'MISMATCH'}")
ok = all(d < args.tol for d in worst.values())
print(f"rank {rank} batch {sizes[rank]} of {sizes}: {'all equal' if ok else 'MISMATCH'}")
report(equal=ok, **{name: diff for name, diff in worst.items()})
finish()
