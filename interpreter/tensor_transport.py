"""Torch tensors between rose's Ray processes as raw bytes passed out of band, not through torch's pickling.

Why: Ray pickles a torch tensor through torch's own reduction, in which every storage becomes a bytes
object copied into the pickle stream and copied back out on the other side. On the H200 that cost ~1 s per
RL iteration for the 79M trainable parameters (315 MB) the PPO trainer publishes to the policy: 9-18% of
every configuration's iteration with the GPU idle (benchmarks/results/paper_table/, the publish -> sync
gap). Here a large contiguous tensor goes to Ray as a numpy uint8 view of its bytes instead: pickle
protocol 5 passes that out of band, into the object store without a pickle copy, and the receiver maps it.

Ray has the same idea behind `RAY_ENABLE_ZERO_COPY_TORCH_TENSORS`, but its receiver gets a tensor that IS
the read-only shared memory: a component that changes an input in place (allowed in rose: local trials
copy inputs for that reason) would change every other reader's value, silently. Here the receiver copies
the bytes once into a tensor of its own, so a component receives what torch's pickling gave it: a fresh,
writable tensor with the same dtype, shape, device and bytes (the stride of a contiguous tensor).

What keeps torch's own path (unchanged behaviour): tensors under `MIN_BYTES` (the per-call hot path of small
values; the detour saves nothing there), tensors that require grad, non-contiguous, sparse, quantized,
conjugate- or negative-bit tensors, views into a larger storage (torch's pickling sends the whole storage and
keeps the view sharing it with the other tensors of the value), and subclasses (`nn.Parameter`: Ray's
dispatch is by exact type). The one difference left: two tensors of one value that are each a whole view of
the SAME storage (`t` and `t.view(...)`) arrive as two tensors of their own, where torch's pickling keeps them
sharing memory; rose's values are component outputs, which do not rely on that.

`register()` installs it in the calling process (Ray's `register_serializer` is per process): the Ray
backend calls it in the driver and every component process does in its worker's constructor.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["MIN_BYTES", "register", "unregister", "pack", "unpack"]

MIN_BYTES = 64 * 1024

_REGISTERED = False


def pack(t: Any) -> tuple:
    """A picklable form of tensor `t`: ("raw", bytes as numpy uint8, dtype, shape, device) for a large
    plain contiguous tensor, else ("torch", torch's own reduction)."""
    import torch

    if (t.layout != torch.strided or t.requires_grad or t.is_quantized or t.is_conj() or t.is_neg()
            or not t.is_contiguous() or t.device.type not in ("cpu", "cuda")
            or t.numel() * t.element_size() < MIN_BYTES
            or t.storage_offset() != 0 or t.untyped_storage().nbytes() != t.numel() * t.element_size()):
        return ("torch", t.__reduce_ex__(5))
    host = t.detach().cpu() if t.device.type != "cpu" else t.detach()
    return ("raw", host.reshape(-1).view(torch.uint8).numpy(), str(t.dtype).removeprefix("torch."),
            tuple(t.shape), str(t.device))


def unpack(packed: tuple) -> Any:
    """The tensor `pack` described, as a tensor of the receiver's own (never a view of shared memory)."""
    if packed[0] == "torch":
        rebuild, args = packed[1][:2]
        return rebuild(*args)
    import numpy as np
    import torch

    _, data, dtype, shape, device = packed
    if device == "cpu":
        flat = torch.from_numpy(np.array(data, copy=True))  # writable, the receiver's own
    else:
        with warnings.catch_warnings():  # a read-only view, copied to the device at once and never written
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.from_numpy(data)
    return flat.view(getattr(torch, dtype)).reshape(shape).to(device)


def register() -> bool:
    """Install the transport for torch tensors in this process's Ray serializer; False when this process
    has no torch or no Ray (nothing to do)."""
    global _REGISTERED
    if _REGISTERED:
        return True
    try:
        import ray.util
        import torch
    except ImportError:
        return False
    ray.util.register_serializer(torch.Tensor, serializer=pack, deserializer=unpack)
    _REGISTERED = True
    return True


def unregister() -> None:
    """Back to torch's own pickling in this process (benchmarks/weight_transfer.py compares the two)."""
    global _REGISTERED
    if _REGISTERED:
        import ray.util
        import torch

        ray.util.deregister_serializer(torch.Tensor)
        _REGISTERED = False
