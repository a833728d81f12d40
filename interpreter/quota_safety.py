"""Is an MPS SM quota safe on this machine? A GEMM self-check, run once per (machine, software, quota).

Why this exists (issue 16, measured on the H200, torch 2.11.0+cu130, driver 580.159.04): under
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, cuBLAS's bf16 GEMMs return WRONG values at some SM counts --
78 SMs (60%), 92 (70%), 38 (30%): hundreds of thousands of elements per product, garbage up to 1e19, on
the forward and both backward products of ordinary Linear shapes -- while 12 (10%), 66 (50%) and 132
(100%) are exact (`benchmarks/results/quota_gemm_probe.json`). The embodied PPO trainer's "NaN at 60%" was this:
a Linear with finite inputs produced non-finite outputs only inside the run, where reused memory held
the garbage. It is a library fault rose cannot repair, so rose does the narrowest safe thing: before a
GPU component runs under a quota below 100%, a fresh MPS client at that quota computes the GEMM shapes
of the models' transformer layers, and whole blocks forward and backward (SDPA, LayerNorm, GELU), in bf16
and compares every output element with a float32 CPU reference, with the allocator poisoned (NaN) so an
unwritten output element is caught too. At 20% (26 SMs) every GEMM and block case passed (H200,
results-archive:benchmarks/results/quota_safety_levels_blocks.json) where the real first PPO update was NaN;
the replay recorded why (quota_nan/before_fix.json): the first non-finite value there came out of a Linear
applied to ONE vector (the time-embedding MLP), a matrix-vector product, so the check now runs those too
(VECTOR_SHAPES) -- whether that makes it refuse 20% is not yet measured on the H200. A quota that fails is
refused (`rose execute` exits 2 naming the quota and the levels found safe) and the optimizer's quota
search only considers levels that pass. Verdicts are cached per GPU, driver, torch/CUDA and quota (a
check costs one CUDA start and 17-23 s on the H200 with the block cases).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["QuotaVerdict", "UnsafeQuota", "check_quota", "check_quotas", "gemm_errors", "block_errors", "BLOCK_CASES", "VECTOR_SHAPES", "vector_errors", "known_safe", "machine_fingerprint", "CHECK_SHAPES"]

# (rows, in, out): the Linear layers of examples/embodied/model.py's transformer blocks -- q (d->d), kv
# (d->2d), out (d->d), MLP (d->4d->d) -- at hidden 512 (embodied_ppo_gpu) over the row counts of its PPO
# minibatches and value batches (tokens x rows: 3200, 6400, 16384), and at hidden 1024 (the paper-shaped
# VLA workloads). Each (rows, in, out) picks its own cuBLAS kernel, and a kernel can be wrong at one SM
# count and right at the next, so the check covers every layer shape, not one per model. The first set
# (9 shapes, without d->d and 3200 rows) passed at 20% (26 SMs), where the real first PPO update of
# embodied_ppo_gpu was NaN (benchmarks/results/quota_safety_levels.json); this set adds d->d (q, out,
# time MLP, value head), the expert's 3200-row products and hidden 1024's real q/kv shapes.
CHECK_SHAPES: tuple[tuple[int, int, int], ...] = tuple(
    (r, k, n) for r in (3200, 6400, 16384) for k, n in ((512, 512), (512, 1024), (512, 2048), (2048, 512))) + tuple(
    (9216, k, n) for k, n in ((1024, 1024), (1024, 2048), (1024, 4096), (4096, 1024)))
# (rows, tokens, hidden, heads): whole transformer blocks, forward and backward, for what the GEMM list
# cannot show -- SDPA, LayerNorm and GELU kernels and their backward reductions, at the sequence shapes of
# the models: the PPO update's prefix (1600 rows x 4 tokens, embodied_ppo_gpu), a 64-token block, and the
# paper-shaped VLA's 256-token prefix at hidden 1024. Both lists pass at 20% (26 SMs; H200),
# where the real first PPO update was NaN: the product that failed there is a vector one (VECTOR_SHAPES).
BLOCK_CASES: tuple[tuple[int, int, int, int], ...] = ((1600, 4, 512, 8), (64, 64, 512, 8), (16, 256, 1024, 16))
# (in, out): Linear layers applied to ONE vector, no batch dimension -- the flow-matching time-embedding
# MLP of examples/embodied/model.py (`time_mlp(_time_features(tau))`: a [d] input, d = 512 in
# embodied_ppo_gpu, 1024 in the paper-shaped VLAs, 2048 at the 1B size). That is a matrix-vector product
# (cuBLAS gemv), a kernel no GEMM or block case runs: at 20% (26 SMs), where both lists pass, the replayed
# first PPO update's first non-finite value was time_mlp.2's output -- 1 of 512 elements, its input finite
# (benchmarks/results/quota_nan_root_cause.json, the 20% step). Forward (W x + b), dgrad (W^T g) and wgrad
# (the outer product g x^T).
VECTOR_SHAPES: tuple[tuple[int, int], ...] = ((512, 512), (1024, 1024), (2048, 2048))
_WRONG = 0.05  # an element off by more than this fraction of the reference's largest magnitude is wrong
# A block's output and gradients pass through several bf16 roundings: in bf16 on the CPU each stays within
# 1% of its largest magnitude (these cases), so the GEMMs' 5% band holds for them too.
_CACHE_ENV = "ROSE_CACHE_DIR"


class UnsafeQuota(ValueError):
    """A quota under which this machine's GEMMs are wrong."""

    def __init__(self, verdict: QuotaVerdict, safe: Sequence[int] = ()) -> None:
        self.verdict = verdict
        known = f"; levels found safe here: {', '.join(f'{q}%' for q in safe)}" if safe else ""
        super().__init__(
            f"MPS quota {verdict.quota}% ({verdict.sm_count} SMs) is unsafe on this machine: bf16 products computed "
            f"under it were wrong in {verdict.bad_products} of {verdict.products} checked products "
            f"({verdict.detail}){known}. This is a fault of the GPU's math library under MPS "
            f"(docs/reliability.md, 'MPS quotas'); choose another quota")


@dataclass(frozen=True)
class QuotaVerdict:
    quota: int
    sm_count: int | None
    ok: bool
    products: int
    bad_products: int
    detail: str
    fingerprint: str


def _wrong(got: Any, ref: Any, shape: Sequence[int], product: str) -> dict[str, Any] | None:
    """One product compared element by element with its float32 reference (both on the CPU): the row
    for the report when any element is non-finite or off by more than _WRONG of the largest magnitude."""
    import torch

    scale = float(ref.abs().max()) or 1.0
    off = (got - ref).abs()
    wrong = int((~torch.isfinite(got)).sum()) + int((off > _WRONG * scale).sum())
    if not wrong:
        return None
    return {"shape": list(shape), "product": product, "wrong_elements": wrong,
            "max_error": float(off.nan_to_num(posinf=float("inf")).max() / scale)}


def gemm_errors(matmul: Callable[[Any, Any], Any] | None = None, device: str = "cuda", dtype_name: str = "bfloat16",
                shapes: Sequence[tuple[int, int, int]] = CHECK_SHAPES,
                poison: Callable[[], None] | None = None,
                refs: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Forward (x @ W^T + b), dgrad (gy @ W) and wgrad (gy^T @ x) of every shape on `device`, each compared
    element by element with a float32 CPU reference. `poison` runs before each product (on CUDA: fill the
    allocator's free memory with NaN). Returns one row per wrong product (empty: all correct)."""
    import torch

    dtype = getattr(torch, dtype_name)
    mm = matmul or (lambda a, b: a @ b)
    bad: list[dict[str, Any]] = []
    for (rows, k, n), (x, w, b, gy) in zip(shapes, _gemm_inputs(shapes), strict=True):
        xd, wd, bd, gyd = (t.to(device, dtype) for t in (x, w, b, gy))
        products = {"fwd": (xd, wd.T, bd), "dgrad": (gyd, wd, None), "wgrad": (gyd.T, xd, None)}
        for name, (left, right, bias) in products.items():
            if poison is not None:
                poison()
            got = mm(left, right)
            key = f"gemm {rows}x{k}x{n} {name}"
            ref = refs[key].float() if refs is not None else _gemm_reference(name, x, w, b, gy)
            row = _wrong((got + bias if bias is not None else got).float().cpu(), ref, (rows, k, n), name)
            if row:
                bad.append(row)
    return bad


def _gemm_inputs(shapes: Sequence[tuple[int, int, int]]) -> Any:
    """Each shape's x, W, b and the output gradient, from one seeded generator (the same in every process)."""
    import torch

    g = torch.Generator().manual_seed(0)
    for rows, k, n in shapes:
        x, w = torch.randn(rows, k, generator=g) * 0.5, torch.randn(n, k, generator=g) / k ** 0.5
        yield x, w, torch.randn(n, generator=g) * 0.1, torch.randn(rows, n, generator=g)


def _gemm_reference(product: str, x: Any, w: Any, b: Any, gy: Any) -> Any:
    """A GEMM product's float32 CPU reference. These (and the blocks') are the check's CPU cost, ~0.5 TFLOP
    and most of a check's 20 s on the H200, and they do not depend on the quota: `check_quotas` computes
    them once (`references`) and lends them to each level's check, so checks side by side do not repeat
    them (six at once on 16 cores took > 150 s for 19 levels, where one alone takes 20 s)."""
    return {"fwd": lambda: x @ w.T + b, "dgrad": lambda: gy @ w, "wgrad": lambda: gy.T @ x}[product]()


def vector_errors(linear: Callable[[Any, Any, Any], Any] | None = None, device: str = "cuda",
                  dtype_name: str = "bfloat16", shapes: Sequence[tuple[int, int]] = VECTOR_SHAPES,
                  poison: Callable[[], None] | None = None) -> list[dict[str, Any]]:
    """Forward, dgrad and wgrad of a Linear applied to one vector, as autograd runs them (F.linear on a
    1-D input and its backward), compared element by element with float32 on the CPU. `linear(x, w, b)`
    replaces F.linear (tests inject faults). One row per wrong tensor."""
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, dtype_name)
    lin = linear or F.linear
    g = torch.Generator().manual_seed(2)
    bad: list[dict[str, Any]] = []
    for k, n in shapes:
        x, w = torch.randn(k, generator=g) * 0.5, torch.randn(n, k, generator=g) / k ** 0.5
        b, gy = torch.randn(n, generator=g) * 0.1, torch.randn(n, generator=g)
        ref = {"vec fwd": w @ x + b, "vec dgrad": w.T @ gy, "vec wgrad": torch.outer(gy, x)}  # O(n k): cheap
        if poison is not None:
            poison()
        xd = x.to(device, dtype, copy=True).requires_grad_()
        wd = w.to(device, dtype, copy=True).requires_grad_()
        y = lin(xd, wd, b.to(device, dtype))
        y.backward(gy.to(device, dtype))
        got = {"vec fwd": y.detach(), "vec dgrad": xd.grad, "vec wgrad": wd.grad}
        bad += [row for name, r in ref.items() if (row := _wrong(got[name].float().cpu(), r, (1, k, n), name))]
    return bad


def _block(x: Any, p: Mapping[str, Any], heads: int, attend: Callable[..., Any]) -> Any:
    """A pre-norm transformer block as examples/embodied/model.py builds it (without its biases)."""
    import torch.nn.functional as F

    n, t, d = x.shape
    h = F.layer_norm(x, (d,))
    q = F.linear(h, p["q"]).view(n, t, heads, d // heads).transpose(1, 2)
    k, v = F.linear(h, p["kv"]).view(n, t, 2, heads, d // heads).permute(2, 0, 3, 1, 4)
    a = attend(q, k, v).transpose(1, 2).reshape(n, t, d)
    x = x + F.linear(a, p["out"])
    return x + F.linear(F.gelu(F.linear(F.layer_norm(x, (d,)), p["up"])), p["down"])


def _block_pass(x: Any, gy: Any, params: Mapping[str, Any], heads: int, device: str, dtype: Any,
                attend: Callable[..., Any]) -> dict[str, Any]:
    """The block's output and the gradients of its input and weights, on `device` in `dtype` (to the CPU)."""
    xs = x.to(device, dtype, copy=True).requires_grad_()  # copies: the reference's leaves stay its own
    ps = {k: w.to(device, dtype, copy=True).requires_grad_() for k, w in params.items()}
    y = _block(xs, ps, heads, attend)
    y.backward(gy.to(device, dtype))
    out = {"y": y.detach(), "dx": xs.grad, **{f"d{k}": w.grad for k, w in ps.items()}}
    return {k: v.float().cpu() for k, v in out.items()}


def block_errors(device: str = "cuda", dtype_name: str = "bfloat16",
                 cases: Sequence[tuple[int, int, int, int]] = BLOCK_CASES,
                 poison: Callable[[], None] | None = None,
                 attention: Callable[..., Any] | None = None,
                 refs: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """One pre-norm transformer block (LayerNorm, q/kv/out projections, SDPA, GELU MLP) per case on
    `device`: its output and the gradients of its input and of every weight, compared with the same block
    in float32 on the CPU. `attention` replaces SDPA (tests inject faults). One row per wrong tensor."""
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, dtype_name)
    bad: list[dict[str, Any]] = []
    for (rows, tokens, d, heads), (params, x, gy) in zip(cases, _block_inputs(cases), strict=True):
        prefix = f"block {rows}x{tokens}x{d}x{heads} "
        ref = ({name[len(prefix):]: t.float() for name, t in refs.items() if name.startswith(prefix)} if refs is not None
               else _block_pass(x, gy, params, heads, "cpu", torch.float32, F.scaled_dot_product_attention))
        if poison is not None:
            poison()
        got = _block_pass(x, gy, params, heads, device, dtype, attention or F.scaled_dot_product_attention)
        bad += [row for name, r in ref.items() if (row := _wrong(got[name], r, (rows, tokens, d), f"block {name}"))]
    return bad


def _block_inputs(cases: Sequence[tuple[int, int, int, int]]) -> Any:
    """Each block case's weights, input and output gradient, seeded per case (the same in every process)."""
    import torch

    for rows, tokens, d, _heads in cases:
        g = torch.Generator().manual_seed(1)
        shapes = {"q": (d, d), "kv": (2 * d, d), "out": (d, d), "up": (4 * d, d), "down": (d, 4 * d)}
        params = {k: torch.randn(*shape, generator=g) / shape[1] ** 0.5 for k, shape in shapes.items()}
        yield params, torch.randn(rows, tokens, d, generator=g), torch.randn(rows, tokens, d, generator=g)


def references(shapes: Sequence[tuple[int, int, int]] = CHECK_SHAPES,
               cases: Sequence[tuple[int, int, int, int]] = BLOCK_CASES) -> dict[str, Any]:
    """Every GEMM product's and block tensor's float32 CPU reference, keyed as `gemm_errors` and
    `block_errors` look them up, stored in bf16 (its rounding, <= 0.4% of an element, is far inside the
    5% band): what `check_quotas` computes once and lends to each level's check."""
    import torch
    import torch.nn.functional as F

    out: dict[str, Any] = {}
    for (rows, k, n), (x, w, b, gy) in zip(shapes, _gemm_inputs(shapes), strict=True):
        for name in ("fwd", "dgrad", "wgrad"):
            out[f"gemm {rows}x{k}x{n} {name}"] = _gemm_reference(name, x, w, b, gy).to(torch.bfloat16)
    for (rows, tokens, d, heads), (params, x, gy) in zip(cases, _block_inputs(cases), strict=True):
        for name, t in _block_pass(x, gy, params, heads, "cpu", torch.float32, F.scaled_dot_product_attention).items():
            out[f"block {rows}x{tokens}x{d}x{heads} {name}"] = t.to(torch.bfloat16)
    return out


def products_checked() -> int:
    """How many tensors one check compares: three per GEMM shape and per vector shape, seven per block case."""
    return 3 * len(CHECK_SHAPES) + 3 * len(VECTOR_SHAPES) + 7 * len(BLOCK_CASES)


_REFERENCES = r'''
import sys, torch
from interpreter.quota_safety import references
torch.save(references(), sys.argv[1] + ".part")
import os; os.replace(sys.argv[1] + ".part", sys.argv[1])
'''

_CHILD = r'''
import json, os, sys, torch
from interpreter.quota_safety import block_errors, gemm_errors, vector_errors
if os.environ.get("ROSE_CHECK_THREADS"):  # checks side by side share the CPU
    torch.set_num_threads(int(os.environ["ROSE_CHECK_THREADS"]))
refs = torch.load(os.environ["ROSE_CHECK_REFERENCES"], mmap=True) if os.environ.get("ROSE_CHECK_REFERENCES") else None
# up to 24 blocks of 256 MB, at most a quarter of the free memory: several checks run side by side next to
# a training run (the optimizer's stage 2), and a check that runs out of memory proves nothing
free, _ = torch.cuda.mem_get_info()
N = max(1, min(24, int(free * 0.25) // (256 << 20)))
def poison():
    blocks = [torch.full((64 << 20,), float("nan"), dtype=torch.float32, device="cuda") for _ in range(N)]
    del blocks
bad = gemm_errors(poison=poison, refs=refs) + vector_errors(poison=poison) + block_errors(poison=poison, refs=refs)
print("QUOTA-CHECK " + json.dumps({"sm_count": torch.cuda.get_device_properties(0).multi_processor_count, "bad": bad}))
'''


def machine_fingerprint() -> str:
    """What the verdict depends on: the GPU, the driver, torch and its CUDA (hence cuBLAS)."""
    import torch

    gpu, driver = "?", "?"
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            gpu = str(pynvml.nvmlDeviceGetName(handle))
            driver = str(pynvml.nvmlSystemGetDriverVersion())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML: the fingerprint says so (pynvml raises its own error types)
        pass
    return f"{gpu}|driver {driver}|torch {torch.__version__}|cuda {torch.version.cuda}"


def _checks_id() -> str:
    """Which check a cached verdict came from: a new shape list is a new check (old verdicts do not count)."""
    import hashlib

    return hashlib.sha1(repr((CHECK_SHAPES, _WRONG, BLOCK_CASES, VECTOR_SHAPES)).encode()).hexdigest()[:10]


def _cache_file() -> Path:
    return Path(os.environ.get(_CACHE_ENV) or Path.home() / ".cache" / "rose") / "mps_quota_checks.json"


def _load_cache(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def check_quota(quota: int, client_env: Mapping[str, str], *, fingerprint: str | None = None,
                cache: Path | None = None, timeout: float = 180.0,
                run_child: Callable[[dict[str, str]], str] | None = None) -> QuotaVerdict:
    """The verdict for `quota` on this machine: cached, else measured in a fresh MPS client started with
    `client_env` (the daemon's pipe directory and the quota). `run_child` replaces the subprocess (tests)."""
    return check_quotas([quota], lambda q: client_env, fingerprint=fingerprint, cache=cache, timeout=timeout,
                        run_child=run_child)[quota]


def check_quotas(quotas: Sequence[int], client_env_of: Callable[[int], Mapping[str, str]], *,
                 fingerprint: str | None = None, cache: Path | None = None, timeout: float = 180.0,
                 parallel: int = 1, run_child: Callable[[dict[str, str]], str] | None = None,
                 on_verdict: Callable[[QuotaVerdict], None] | None = None,
                 stop: Callable[[], Any] | None = None) -> dict[int, QuotaVerdict]:
    """Verdicts for several quotas: cached ones read, the others measured -- up to `parallel` fresh MPS
    clients at once, each at its own quota. A check is one CUDA start plus a few seconds of small GEMMs
    (~18 s on the H200), so a search that meets a run of unsafe levels (on the H200, 60% to 88% are
    nearly all unsafe) checks them side by side instead of one after another; each client sees only its
    own quota's SMs, so the checks do not change each other's kernels. The CPU references are computed
    once and shared (`references`), and each check gets its share of the CPU threads: six checks of 16
    threads each on 16 cores did not finish 19 levels in 150 s on the H200 host. `stop()` true (a stop request:
    `rose optimize`'s SIGTERM) ends the checks in flight at once; their levels stay unknown, so unsafe and
    not cached -- a batch takes 20-40 s, longer than the grace a signal leaves before SIGKILL."""
    from concurrent.futures import ThreadPoolExecutor

    fingerprint = fingerprint if fingerprint is not None else machine_fingerprint()
    path = cache or _cache_file()
    key = f"{fingerprint}|check {_checks_id()}|quota "
    entries = _load_cache(path)
    verdicts = {q: QuotaVerdict(**entries[key + str(q)]) for q in quotas if key + str(q) in entries}
    todo = [q for q in dict.fromkeys(quotas) if q not in verdicts]
    if not todo:
        return verdicts
    root = str(Path(__file__).resolve().parent.parent)
    shared: dict[str, str] = {}
    if run_child is None:
        refs_path = _references_file(root, timeout)
        if refs_path is not None:
            shared["ROSE_CHECK_REFERENCES"] = str(refs_path)
        shared["ROSE_CHECK_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, min(parallel, len(todo)))))

        def run_child(e: dict[str, str]) -> str:
            return _run_check(e, timeout, stop)

    def one(quota: int) -> QuotaVerdict:
        env = {**os.environ, **shared, **client_env_of(quota), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(quota)}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        verdict = _verdict(quota, run_child(env), fingerprint)
        if on_verdict is not None:  # progress, as each check ends (a batch can take a while)
            on_verdict(verdict)
        return verdict

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(todo)))) as pool:
        measured = dict(zip(todo, pool.map(one, todo), strict=True))
    verdicts.update(measured)
    entries = _load_cache(path)
    # a check that did not run (sm_count None) says nothing about the quota: not cached
    entries.update({key + str(q): asdict(v) for q, v in measured.items() if v.sm_count is not None})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries, indent=1))
        tmp.replace(path)
    except OSError:  # a read-only home: the verdicts still hold for this run
        pass
    return verdicts


def _run_check(env: dict[str, str], timeout: float, stop: Callable[[], Any] | None) -> str:
    """One check's process: its output, or why it has none (too slow, or stopped)."""
    import tempfile
    import time

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", _CHILD], env=env, stdout=out, stderr=err, text=True)
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None:
                if stop is not None and stop():
                    return "the check was stopped (a stop request)"
                if time.monotonic() > deadline:
                    return f"the check took longer than {timeout:.0f} s"
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        err.seek(0)
        return out.read() + (f"\n{err.read()[-800:]}" if proc.returncode else "")


_REFERENCES_DIR: list[Path] = []  # this process's directory for the references (removed at exit)


def _references_file(root: str, timeout: float) -> Path | None:
    """The references every check compares with, computed once per process on the CPU (no CUDA) into a
    temporary directory removed when this process exits -- 0.8 GB, too much to leave in a user's cache
    for a check whose verdicts are cached anyway; None (each check computes its own) when they cannot be
    written."""
    import atexit
    import shutil
    import tempfile

    if not _REFERENCES_DIR:
        _REFERENCES_DIR.append(Path(tempfile.mkdtemp(prefix="rose-quota-refs-")))
        atexit.register(shutil.rmtree, _REFERENCES_DIR[0], True)
    path = _REFERENCES_DIR[0] / f"references_{_checks_id()}.pt"
    if path.exists():
        return path
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    try:
        subprocess.run([sys.executable, "-c", _REFERENCES, str(path)], env=env, capture_output=True, timeout=timeout,
                       check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return path if path.exists() else None


def _verdict(quota: int, output: str, fingerprint: str) -> QuotaVerdict:
    """A check's output read as a verdict; a check that did not run is not safe (unknown is not safe)."""
    line = next((ln for ln in reversed(output.splitlines()) if ln.startswith("QUOTA-CHECK ")), None)
    if line is None:
        return QuotaVerdict(quota, None, False, products_checked(), products_checked(),
                            f"the check did not run: {output.strip()[-300:]}", fingerprint)
    result = json.loads(line[len("QUOTA-CHECK "):])
    bad = result["bad"]
    worst = max(bad, key=lambda b: b["wrong_elements"]) if bad else None
    detail = (f"e.g. {worst['product']} of {'x'.join(map(str, worst['shape']))}: {worst['wrong_elements']} elements wrong"
              if worst else "every element within bf16 rounding")
    return QuotaVerdict(quota, result["sm_count"], not bad, products_checked(), len(bad), detail, fingerprint)


def known_safe(fingerprint: str, cache: Path | None = None) -> list[int]:
    """Quotas already verified safe on this machine (from the cache)."""
    prefix = f"{fingerprint}|check {_checks_id()}|quota "
    return sorted(v["quota"] for k, v in _load_cache(cache or _cache_file()).items() if k.startswith(prefix) and v["ok"])
