"""Memory a run's steps add above the model they train, measured to check `swiftkv distill --plan`.

Two readings. The device's: on a CPU the resident set's peak (VmHWM), reset when the steps start
(Linux's /proc/self/clear_refs) so that loading the model and reading the data do not hide it; on CUDA
torch's allocated peak. And the tensors' own (`TensorBytes`): the storages the steps create, alive at
once, which is what the plan counts and what CUDA's allocated peak counts; a CPU's resident set also
holds what its allocator freed but kept (glibc keeps freed blocks of one micro-batch beside the next)."""

from __future__ import annotations

import weakref

import torch
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ... import hostmemory


def current_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    return host_mib(hostmemory.status_mib("VmRSS"))


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    hostmemory.reset_peak()  # None where it cannot: the peak then counts from the process's start


def peak_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return host_mib(hostmemory.peak_mib())


def host_mib(value: float | None) -> float:
    if value is None:
        raise RuntimeError(
            "this process's host memory is read from /proc/self/status, which this system lacks"
        )
    return value


class TensorBytes(TorchDispatchMode):
    """Counts the bytes of the tensor storages that ops inside it create, from the op that creates one
    until it is freed; `peak` is the most alive at once. Storages made before it (the model) are not
    counted, so the peak is what the steps add above the model, tensor by tensor."""

    def __init__(self):
        super().__init__()
        # id of a live storage -> (a weak reference whose callback frees it, its bytes)
        self.alive: dict[int, tuple[weakref.ref, int]] = {}
        self.current = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                for storage in get_untyped_storages(leaf):
                    self.count(storage)
        return out

    def count(self, storage: torch.UntypedStorage) -> None:
        key = id(storage)
        if key in self.alive:  # a view of a storage already counted
            return
        size = storage.nbytes()
        self.alive[key] = (weakref.ref(storage, lambda _, key=key: self.free(key)), size)
        self.current += size
        self.peak = max(self.peak, self.current)

    def free(self, key: int) -> None:
        _, size = self.alive.pop(key, (None, 0))
        self.current -= size

    @property
    def peak_mib(self) -> float:
        return round(self.peak / 2**20, 1)
