"""Torch tensors between rose's Ray processes as raw bytes passed out of band, not through torch's pickling.

Why: Ray pickles a torch tensor through torch's own reduction, in which every storage becomes a bytes
object copied into the pickle stream and copied back out on the other side. On the H200 that cost ~1 s per
RL iteration for the 79M trainable parameters (315 MB) the PPO trainer publishes to the policy: 9-18% of
every configuration's iteration with the GPU idle (results-archive:benchmarks/results/paper_table/, the publish -> sync
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

Between two processes on the SAME GPU a CUDA tensor can skip the host altogether (CUDA IPC, as colocated RL
frameworks sync weights): on the H200 the 315-MB weight refresh inside a compiled graph took 0.93 s with
torch's pickling, 0.44 s with the raw bytes above and 0.018 s by IPC (benchmarks/weight_transfer.py). The
runtime turns it on per call site (`device_site`), only where it knows every reader: a compiled graph's call
whose value is read by other processes on the producer's GPU only, each of whose methods takes tensors on
its device (`ipc_sites`). Then `pack` clones the tensor into memory the transport owns (nobody writes it)
and sends its IPC handle; the receiver copies it into a tensor of its own on its GPU and waits for the copy,
so a receiver still gets a fresh writable tensor nobody else sees. The clones of a site's last two calls
are kept: a compiled graph's channel takes a call's next value only after every reader has read the
previous one, so by a site's next call every copy of its last value is done (a second generation is margin).
"""

from __future__ import annotations

import threading
import warnings
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

__all__ = ["MIN_BYTES", "register", "unregister", "pack", "unpack", "device_site", "release_sites", "ipc_sites"]

MIN_BYTES = 64 * 1024

_REGISTERED = False
_SITE = threading.local()  # the call site whose outputs this thread serialises next (a compiled graph's loop)
_KEPT: dict[Hashable, deque[list[Any]]] = {}  # per IPC site: the clones of its last two calls


def device_site(site: Hashable | None) -> None:
    """The call about to run in this thread is `site`, whose CUDA tensors go to their readers by CUDA IPC
    (None: the call is not such a site). Starts the site's new generation of kept clones."""
    _SITE.key = site
    if site is not None:
        _KEPT.setdefault(site, deque(maxlen=2)).append([])


def release_sites(plans: Sequence[Hashable] | None = None) -> None:
    """Drop the kept clones of these plans' compiled graphs (a site of a plan's graph is the pair
    `(plan, call site)`), or every kept clone (None). Called when another graph becomes the one that runs:
    the previous graph's iteration has ended, so every reader has copied its values."""
    if plans is None:
        _KEPT.clear()
        return
    gone = set(plans)
    for key in [k for k in _KEPT if isinstance(k, tuple) and k and k[0] in gone]:
        del _KEPT[key]


def current_site() -> Hashable | None:
    return getattr(_SITE, "key", None)


def ipc_sites(producer: Mapping[Any, str], readers: Mapping[Any, Sequence[tuple[str, str]]], to_driver: set[Any],
              slot: Mapping[str, int | None], device_inputs: Mapping[str, set[str]]) -> dict[str, set[Any]]:
    """Which call sites may pass their CUDA tensors by IPC, per producing process: those read by at least one
    other process, never by the driver or by their own process, every reader on the producer's GPU slot and
    calling a method that takes tensors on its device (`device_inputs`, the components' `rose_device_inputs`).
    `producer`: site -> process; `readers`: site -> (process, method) per reading call; `slot`: process -> GPU
    slot (None: not a GPU process)."""
    sites: dict[str, set[Any]] = {}
    for site, proc in producer.items():
        here = slot.get(proc)
        reads = readers.get(site, ())
        if (here is None or not reads or site in to_driver
                or any(r == proc or slot.get(r) != here or m not in device_inputs.get(r, ()) for r, m in reads)):
            continue
        sites.setdefault(proc, set()).add(site)
    return sites


def pack(t: Any) -> tuple:
    """A picklable form of tensor `t`: ("ipc", CUDA IPC reduction of a clone, device UUID) for a CUDA tensor
    of an IPC site; ("raw", bytes as numpy uint8, dtype, shape, device) for a large plain contiguous
    tensor, else ("torch", torch's own reduction)."""
    import torch

    site = current_site()
    if site is not None and t.device.type == "cuda" and t.layout == torch.strided and not t.requires_grad \
            and type(t) is torch.Tensor:
        from torch.multiprocessing.reductions import reduce_tensor

        clone = t.detach().clone()  # the transport's own memory: the producer may change `t` in place later
        _KEPT[site][-1].append(clone)
        return ("ipc", reduce_tensor(clone), str(torch.cuda.get_device_properties(t.device).uuid))
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
    if packed[0] == "ipc":
        return _from_ipc(*packed[1:])
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


def _from_ipc(reduced: tuple, uuid: str) -> Any:
    """A tensor of the receiver's own from a CUDA IPC handle: opened on the receiver's device with that UUID
    (a process numbers only the GPUs it sees), copied, the copy waited for, the shared mapping dropped."""
    import torch

    index = next((i for i in range(torch.cuda.device_count())
                  if str(torch.cuda.get_device_properties(i).uuid) == uuid), None)
    if index is None:
        raise RuntimeError(f"a CUDA IPC tensor from GPU {uuid}, which this process does not see (rose passes "
                           "tensors by IPC only between processes on one GPU)")
    rebuild, args = reduced
    args = list(args)
    args[6] = index  # torch's rebuild_cuda_tensor: the storage's device, in the receiver's numbering
    shared = rebuild(*args)
    own = shared.clone()
    torch.cuda.current_stream(index).synchronize()  # the copy is done before the producer may free its clone
    del shared
    return own


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
