"""Several PyTorch ranks on one GPU, as dpar's GPU benchmarks run theirs: NCCL refuses two ranks
on one device of one host, so each rank takes its own NCCL_HOSTID and the ranks talk over
NCCL's socket transport on lo (P2P, SHM and InfiniBand off unless the caller set them)."""
import os


def share_one_gpu(rank, tag):
    os.environ["NCCL_HOSTID"] = "%s-%d" % (tag, rank)
    for key in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE"):
        os.environ.setdefault(key, "1")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
