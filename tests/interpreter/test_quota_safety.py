"""The MPS quota self-check (interpreter/quota_safety.py): wrong GEMMs are caught element by element,
verdicts are cached per machine and quota, an unknown verdict is never 'safe', and `rose execute`
refuses an unsafe quota with the levels found safe (the H200 fault behind issue 16's NaN)."""

from __future__ import annotations

import json

import pytest
import torch

from interpreter.quota_safety import (
    BLOCK_CASES,
    CHECK_SHAPES,
    QuotaVerdict,
    UnsafeQuota,
    block_errors,
    check_quota,
    gemm_errors,
    known_safe,
    vector_errors,
)

SMALL = ((64, 32, 48), (96, 64, 32))


def test_correct_products_pass() -> None:
    assert gemm_errors(device="cpu", dtype_name="float32", shapes=SMALL) == []


def test_a_product_with_a_garbage_tile_is_caught() -> None:
    def faulty(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = a @ b
        if out.shape[0] >= 64:
            out[:16, :16] = 1e19  # what cuBLAS returned for whole tiles under MPS at 78 SMs
        return out

    bad = gemm_errors(faulty, device="cpu", dtype_name="float32", shapes=SMALL)
    assert bad and all(b["wrong_elements"] >= 16 * 16 - 16 for b in bad)
    assert {b["product"] for b in bad} <= {"fwd", "dgrad", "wgrad"}


def test_an_unwritten_output_reading_poison_is_caught() -> None:
    def unwritten(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = a @ b
        out[-1, -1] = float("nan")
        return out

    bad = gemm_errors(unwritten, device="cpu", dtype_name="float32", shapes=SMALL[:1])
    assert [b["wrong_elements"] for b in bad] == [1, 1, 1]


TINY_BLOCKS = ((16, 8, 64, 4), (4, 32, 32, 2))


def test_a_correct_transformer_block_passes_in_float32_and_bf16() -> None:
    """The block check has no false alarms: bf16 through a whole block stays inside the band."""
    assert block_errors(device="cpu", dtype_name="float32", cases=TINY_BLOCKS) == []
    assert block_errors(device="cpu", dtype_name="bfloat16", cases=TINY_BLOCKS) == []


def test_a_faulty_attention_kernel_is_caught_in_the_output_and_the_gradients() -> None:
    """What the GEMM list cannot see: a wrong SDPA (here NaN in a few outputs, as an unwritten tile
    reads the poisoned allocator) shows up in the block's output and in the gradients behind it."""
    import torch.nn.functional as F

    def faulty(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        y = F.scaled_dot_product_attention(q, k, v)
        mask = torch.zeros_like(y, dtype=torch.bool)
        mask[0, 0, 0, :4] = True
        return torch.where(mask, torch.full_like(y, float("nan")), y)

    bad = block_errors(device="cpu", dtype_name="float32", cases=TINY_BLOCKS[:1], attention=faulty)
    names = {b["product"] for b in bad}
    assert {"block y", "block dx", "block dq"} <= names and all(b["shape"] == [16, 8, 64] for b in bad)


def test_shared_references_give_the_same_verdicts_as_computing_them_in_the_check(tmp_path) -> None:
    """`check_quotas` computes the CPU references once and lends them (saved, memory-mapped) to every
    level's check: with them a correct run still passes, the same faults are still caught, and every
    product the check compares has its reference."""
    from interpreter.quota_safety import references

    path = tmp_path / "refs.pt"
    torch.save(references(shapes=SMALL, cases=TINY_BLOCKS), path)
    refs = torch.load(path, mmap=True)
    assert gemm_errors(device="cpu", dtype_name="float32", shapes=SMALL, refs=refs) == []
    assert block_errors(device="cpu", dtype_name="bfloat16", cases=TINY_BLOCKS, refs=refs) == []

    def faulty(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = a @ b
        out[0, 0] = float("nan")
        return out

    def rows(bad: list[dict]) -> list[tuple]:  # max_error differs in the last bits: the shared refs are bf16
        return [(b["shape"], b["product"], b["wrong_elements"]) for b in bad]

    assert (rows(gemm_errors(faulty, device="cpu", dtype_name="float32", shapes=SMALL, refs=refs))
            == rows(gemm_errors(faulty, device="cpu", dtype_name="float32", shapes=SMALL)))
    assert len(gemm_errors(faulty, device="cpu", dtype_name="float32", shapes=SMALL, refs=refs)) == 6
    with pytest.raises(KeyError):  # a missing reference is an error, never a silent pass
        gemm_errors(device="cpu", dtype_name="float32", shapes=((8, 8, 8),), refs=refs)
    block_keys = {k for k in refs if k.startswith("block ")}
    assert len(block_keys) == 7 * len(TINY_BLOCKS)


def test_vector_products_pass_and_a_wrong_element_of_one_is_caught() -> None:
    """The matrix-vector products (a Linear on one vector, the time-embedding MLP's): no false alarm in
    float32 or bf16; one wrong output element -- what time_mlp.2 returned at 26 SMs on the H200 -- is
    caught in the forward and, through autograd, in the gradients behind it."""
    import torch.nn.functional as F

    shapes = ((64, 64), (128, 32))
    assert vector_errors(device="cpu", dtype_name="float32", shapes=shapes) == []
    assert vector_errors(device="cpu", dtype_name="bfloat16", shapes=shapes) == []

    def faulty(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, w, b)
        return torch.where(torch.arange(y.shape[0]) == 3, torch.full_like(y, float("nan")), y) if x.dim() == 1 else y

    bad = vector_errors(faulty, device="cpu", dtype_name="float32", shapes=shapes[:1])
    assert [b["product"] for b in bad] == ["vec fwd", "vec dgrad", "vec wgrad"]
    assert bad[0]["wrong_elements"] == 1 and bad[0]["shape"] == [1, 64, 64]
    from interpreter.quota_safety import VECTOR_SHAPES, products_checked

    assert products_checked() == 3 * len(CHECK_SHAPES) + 3 * len(VECTOR_SHAPES) + 7 * len(BLOCK_CASES)
    assert (512, 512) in VECTOR_SHAPES  # the time MLP of embodied_ppo_gpu, where 20% failed


def _child_output(bad: list) -> str:
    return "noise\nQUOTA-CHECK " + json.dumps({"sm_count": 78, "bad": bad})


def test_verdicts_are_cached_per_machine_and_quota(tmp_path) -> None:
    calls: list[dict] = []

    def child(env: dict) -> str:
        calls.append(env)
        return _child_output([{"shape": [6400, 512, 1024], "product": "fwd", "wrong_elements": 206386, "max_error": 0.9}])

    cache = tmp_path / "checks.json"
    v = check_quota(60, {"CUDA_MPS_PIPE_DIRECTORY": "/p"}, fingerprint="H200|580", cache=cache, run_child=child)
    assert not v.ok and v.sm_count == 78 and v.bad_products == 1 and "206386" in v.detail
    assert calls[0]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "60" and calls[0]["CUDA_MPS_PIPE_DIRECTORY"] == "/p"
    assert check_quota(60, {}, fingerprint="H200|580", cache=cache, run_child=child) == v
    assert len(calls) == 1  # from the cache
    check_quota(50, {}, fingerprint="H200|580", cache=cache, run_child=lambda env: _child_output([]))
    check_quota(60, {}, fingerprint="other GPU", cache=cache, run_child=lambda env: _child_output([]))
    assert known_safe("H200|580", cache) == [50]
    assert known_safe("other GPU", cache) == [60]


def test_a_check_that_did_not_run_is_unsafe_and_not_cached(tmp_path) -> None:
    cache = tmp_path / "checks.json"
    v = check_quota(40, {}, fingerprint="f", cache=cache, run_child=lambda env: "Traceback: CUDA error")
    assert not v.ok and "did not run" in v.detail
    assert check_quota(40, {}, fingerprint="f", cache=cache, run_child=lambda env: _child_output([])).ok


def test_several_quotas_are_checked_side_by_side_each_in_its_own_client(tmp_path) -> None:
    """check_quotas runs the uncached checks concurrently (the optimizer meets runs of unsafe levels),
    each child under its own quota, and caches what ran; a cached level starts no child."""
    import threading
    import time

    from interpreter.quota_safety import check_quotas

    running, peak, lock = [0], [0], threading.Lock()
    quotas_seen: list[str] = []

    def child(env: dict) -> str:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            quotas_seen.append(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        q = int(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
        return "crash" if q == 30 else _child_output([] if q % 20 == 0 else [{"shape": [1, 1, 1], "product": "fwd",
                                                                                   "wrong_elements": 1, "max_error": 1.0}])

    cache = tmp_path / "checks.json"
    check_quota(40, {}, fingerprint="f", cache=cache, run_child=child)  # cached before
    quotas_seen.clear()
    got = check_quotas([40, 50, 60, 70, 80, 30], lambda q: {"CUDA_MPS_PIPE_DIRECTORY": f"/p{q}"}, fingerprint="f",
                       cache=cache, parallel=4, run_child=child)
    assert sorted(quotas_seen) == ["30", "50", "60", "70", "80"] and peak[0] > 1
    assert {q for q, v in got.items() if v.ok} == {40, 60, 80}
    assert "did not run" in got[30].detail
    assert known_safe("f", cache) == [40, 60, 80]
    again = check_quotas([30, 50], lambda q: {}, fingerprint="f", cache=cache, run_child=lambda env: _child_output([]))
    assert again[30].ok and not again[50].ok  # 30 was not cached (it did not run), 50 was


def test_execute_refuses_an_unsafe_quota_naming_the_safe_levels(monkeypatch, tmp_path) -> None:
    import interpreter.quota_safety as qs
    from rose_cli import run
    from rose_dsl.ir import Component

    verdicts = {60: QuotaVerdict(60, 78, False, 27, 5, "e.g. dgrad of 6400x512x1024: 165779 elements wrong", "f"),
                50: QuotaVerdict(50, 66, True, 27, 0, "every element within bf16 rounding", "f")}
    monkeypatch.setattr(qs, "machine_fingerprint", lambda: "f")
    monkeypatch.setattr(qs, "check_quota", lambda quota, env, fingerprint=None: verdicts[quota])
    monkeypatch.setattr(qs, "known_safe", lambda fingerprint: [50, 100])

    class Daemon:
        def client_env(self, quota):
            return {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(quota)}

    from rich.console import Console

    comps = [Component("policy", "m:C", {}, "gpu", mps_quota=50), Component("trainer", "m:C", {}, "gpu", mps_quota=60)]
    with pytest.raises(run.SetupError) as caught:
        run.check_quotas(comps, Daemon(), Console(file=open(tmp_path / "log", "w")))
    message = str(caught.value)
    assert "MPS quota 60% (78 SMs) is unsafe" in message and "50%, 100%" in message and "--no-quota-check" in message
    run.check_quotas(comps[:1], Daemon(), Console(file=open(tmp_path / "log2", "w")))  # 50% passes
    assert isinstance(UnsafeQuota(verdicts[60]), ValueError)


def test_the_shared_references_are_computed_once_per_process_in_a_temporary_directory(monkeypatch) -> None:
    """The references (0.8 GB for the real check set) live in a directory of this process's, not in the
    user's cache, and are computed once however many batches of checks ask for them."""
    import tempfile
    from pathlib import Path

    import interpreter.quota_safety as qs

    tiny = ("import sys, torch\nfrom interpreter.quota_safety import references\n"
            "torch.save(references(shapes=((8, 8, 8),), cases=()), sys.argv[1])\n")
    monkeypatch.setattr(qs, "_REFERENCES", tiny)
    monkeypatch.setattr(qs, "_REFERENCES_DIR", [])
    root = str(Path(qs.__file__).resolve().parents[1])
    first = qs._references_file(root, 120.0)
    assert first is not None and first.is_file() and str(first).startswith(tempfile.gettempdir())
    stamp = first.stat().st_mtime_ns
    assert qs._references_file(root, 120.0) == first and first.stat().st_mtime_ns == stamp  # not recomputed
    assert set(torch.load(first)) == {"gemm 8x8x8 fwd", "gemm 8x8x8 dgrad", "gemm 8x8x8 wgrad"}


@pytest.mark.timeout(120)
def test_a_stop_request_ends_a_check_in_flight_at_once_and_its_level_stays_unknown(monkeypatch, tmp_path) -> None:
    """A check batch takes 20-40 s on an H100, longer than the grace between a SIGTERM and the SIGKILL that
    follows it (2026-12-05: the optimizer was killed in a batch, with no report): a stop request kills the
    checks in flight, and their levels are unknown -- not safe, not cached."""
    import interpreter.quota_safety as qs

    # checks that would run an hour, and a stop request from the third time it is asked (not after a wall
    # time): returning at all shows they were killed -- the test's timeout ends one that waited for them
    monkeypatch.setattr(qs, "_CHILD", "import time; time.sleep(3600)")
    monkeypatch.setattr(qs, "_references_file", lambda root, timeout: None)
    asked = {"n": 0}

    def stop() -> bool:
        asked["n"] += 1
        return asked["n"] > 2

    verdicts = qs.check_quotas([80, 82], lambda q: {}, fingerprint="test", cache=tmp_path / "cache.json", parallel=2,
                               stop=stop)
    assert asked["n"] > 2
    assert all(not v.ok and v.sm_count is None and "stopped" in v.detail for v in verdicts.values())
    assert not (tmp_path / "cache.json").exists() or "quota 80" not in (tmp_path / "cache.json").read_text()
