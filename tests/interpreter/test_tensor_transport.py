"""Torch tensors between Ray processes (interpreter/tensor_transport.py): a receiver gets exactly what torch's
own pickling gives it -- same dtype, shape, bytes, a writable tensor of its own -- whichever path a tensor
takes, and a large one takes the out-of-band path."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from interpreter.tensor_transport import MIN_BYTES, pack, unpack  # noqa: E402

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8,
          torch.int8, torch.bool, torch.complex64]


def _big(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 100
    if dtype == torch.bool:
        return x > 0
    if dtype.is_complex:
        return torch.complex(x.float(), -x.float()).to(dtype)
    return x.to(dtype)


def _bytes(t: torch.Tensor) -> str:
    import hashlib

    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    assert (a.dtype, a.shape, a.stride(), a.device) == (b.dtype, b.shape, b.stride(), b.device)
    assert a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8)) if a.is_contiguous() \
        else torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_large_contiguous_tensor_takes_the_raw_path_and_comes_back_bit_identical(dtype) -> None:
    t = _big(dtype, (300, 257))
    assert t.numel() * t.element_size() >= MIN_BYTES
    packed = pack(t)
    assert packed[0] == "raw"
    got = unpack(pickle.loads(pickle.dumps(packed, protocol=5)))
    _same(t, got)


def test_what_keeps_torchs_own_path() -> None:
    big = _big(torch.float32, (512, 512))
    cases = {
        "small": torch.arange(10.0),
        "non-contiguous": big.t(),
        "requires grad": big.clone().requires_grad_(),
        "zero-dim": torch.tensor(3.5),
        "a view into a larger storage": big[100:400],
    }
    for what, t in cases.items():
        packed = pack(t)
        assert packed[0] == "torch", what
        got = unpack(pickle.loads(pickle.dumps(packed, protocol=5)))
        assert got.stride() == t.stride() and got.requires_grad == t.requires_grad, what
        assert got.storage_offset() == t.storage_offset(), what  # (the view keeps its place in its storage)
        assert torch.equal(got.detach(), t.detach()), what


def test_the_receivers_tensor_is_its_own_and_writable() -> None:
    t = _big(torch.float32, (256, 256))
    kind, data, *rest = pack(t)
    data.flags.writeable = False  # as a value mapped from Ray's object store arrives
    first, second = unpack((kind, data, *rest)), unpack((kind, data, *rest))
    first.add_(1.0)  # a component may change an input in place
    assert torch.equal(second, t) and not torch.equal(first, t)


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(DTYPES), shape=st.lists(st.integers(0, 70), min_size=1, max_size=4),
       transpose=st.booleans())
def test_any_tensor_round_trips_as_torch_pickles_it(dtype, shape, transpose) -> None:
    t = _big(dtype, tuple(shape))
    if transpose and t.dim() >= 2:
        t = t.transpose(0, -1)
    reference = pickle.loads(pickle.dumps(t))
    got = unpack(pickle.loads(pickle.dumps(pack(t), protocol=5)))
    assert (got.dtype, got.shape, got.stride()) == (reference.dtype, reference.shape, reference.stride())
    assert torch.equal(got, reference)


def test_between_ray_actors_a_large_tensor_arrives_intact_and_private(ray_session) -> None:
    ray = ray_session
    @ray.remote
    class Holder:
        def __init__(self) -> None:
            from interpreter.tensor_transport import register

            assert register()

        def make(self) -> dict:
            return {"w": _big(torch.bfloat16, (1024, 300)), "b": _big(torch.float32, (700, 100))}

        def change_and_sum(self, w: dict) -> float:
            w["w"].add_(1.0)  # in place, on what arrived
            return float(w["w"].float().sum())

        def digest(self, w: dict) -> list:
            return [_bytes(w["w"]), _bytes(w["b"]), str(w["w"].dtype)]

        def mixed(self) -> dict:
            big = _big(torch.float32, (512, 512))
            return {"small": torch.arange(10.0), "t": big.t(), "grad": big.clone().requires_grad_(),
                    "p": torch.nn.Parameter(big.clone()), "view": big[100:400], "nested": [big[::2], (big,)]}

        def shapes(self, d: dict) -> dict:
            return {k: (type(v).__name__, v.stride(), v.storage_offset(), v.requires_grad)
                    for k, v in d.items() if isinstance(v, torch.Tensor)}

    a, b, c = Holder.remote(), Holder.remote(), Holder.remote()
    ref = a.make.remote()
    ray.get(b.change_and_sum.remote(ref))
    got = ray.get(c.digest.remote(ref))  # the same object, read after b changed its copy
    assert got == [_bytes(_big(torch.bfloat16, (1024, 300))), _bytes(_big(torch.float32, (700, 100))),
                   "torch.bfloat16"]
    mixed = a.mixed.remote()  # the values that keep torch's path, through Ray's pickler with the transport on
    assert ray.get(b.shapes.remote(mixed)) == {
        "small": ("Tensor", (1,), 0, False), "t": ("Tensor", (1, 512), 0, False),
        "grad": ("Tensor", (512, 1), 0, True), "p": ("Parameter", (512, 1), 0, True),
        "view": ("Tensor", (512, 1), 100 * 512, False)}
    d, big = ray.get(mixed), _big(torch.float32, (512, 512))
    assert torch.equal(d["t"], big.t()) and torch.equal(d["nested"][0], big[::2]) and torch.equal(d["nested"][1][0], big)
