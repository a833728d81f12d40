"""Generator: K completions per prompt with prefix sharing and continuous batching (`generator.generate`).

The shape of the work follows the lecture's rollout engine, scaled down:
- one prefill per prompt; its KV cache is copied into the decode slots of the prompt's K samples
  (expanded, never recomputed) and released once the last of the K samples has been admitted;
- a fixed number of decode slots (`max_batch`); after every decode step, sequences that emitted EOS or
  reached `max_new_tokens` free their slot, and pending (prompt, sample) work takes it at once;
- per-token sampling log-probs are recorded alongside the tokens (the PPO ratio's pi_old).

Reproducibility: each (prompt, sample) draws from its own uniform stream keyed by (seed, it, prompt id,
sample index), and on the CPU every decode-step computation is row-invariant (see `model.py`). The
result for a prompt is therefore bit-identical whether it is generated alone, with other prompts, or
with any number of decode slots: generation is split-invariant along prompts (`batch: 0`).
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import torch

from examples.llm.model import KVCache
from examples.llm.policy import PolicySpec, build_policy, clone_weights, param_hash, params_to
from examples.llm.sampling import allowed_logits, forced_lengths, lognormal_params, sample_rows, uniform_streams
from examples.llm.tokenizer import CharTokenizer

Record = dict[str, torch.Tensor]


class WeightSyncError(RuntimeError):
    """The weights received by `load_weights` do not hash to the hash the learner published."""


class Generator:
    """The rollout policy. State `weights` (the parameters; refreshed by `load_weights`)."""

    def __init__(
        self,
        k: int,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        device: str = "cpu",
        max_batch: int = 64,
        policy: Mapping[str, Any] | None = None,
        cache_dir: str | None = None,
        tokenizer_hash: str | None = None,
        length_mean: float = 0.0,
        length_p99: float = 0.0,
    ) -> None:
        self.spec = PolicySpec.from_args(policy)
        if int(k) < 1:
            raise ValueError(f"Generator: k (samples per prompt) must be >= 1, got {k}")
        if not 1 <= int(max_new_tokens) < self.spec.context:
            raise ValueError(
                f"Generator: max_new_tokens must be in [1, context={self.spec.context}), got {max_new_tokens}"
            )
        if not temperature > 0:
            raise ValueError(f"Generator: temperature must be > 0, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"Generator: top_p must be in (0, 1], got {top_p}")
        if int(max_batch) < 1:
            raise ValueError(f"Generator: max_batch (decode slots) must be >= 1, got {max_batch}")
        if bool(length_mean) != bool(length_p99):
            raise ValueError("Generator: give both length_mean and length_p99 (forced completion lengths) or neither")
        self.lengths = (float(length_mean), float(length_p99)) if length_mean else None
        if self.lengths:
            lognormal_params(*self.lengths)  # a pair no lognormal has is an error here, not at the first call
        self.k, self.max_new_tokens, self.max_batch = int(k), int(max_new_tokens), int(max_batch)
        self.temperature, self.top_p, self.seed = float(temperature), float(top_p), int(seed)
        self.device = torch.device(device)
        self.tokenizer = CharTokenizer()
        self.tokenizer_hash = self.tokenizer.hash()
        if tokenizer_hash is not None:
            self.tokenizer.check(tokenizer_hash, "Generator")
        self.model = build_policy(self.spec, self.seed, self.device, cache_dir).eval()
        self.weights_hash = param_hash(self.model.state_dict())  # of the fp32 weights, as the learner's
        # bit-exact row invariance is a CPU property; on CUDA use the fast kernels and bf16 weights
        self.row_invariant = self.device.type == "cpu"
        if self.device.type == "cuda":
            params_to(self.model, torch.bfloat16)
        self.version = 0
        self._metrics: dict[str, float] = {}

    # -- state ---------------------------------------------------------------------------------------
    @property
    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    @weights.setter
    def weights(self, w: Mapping[str, torch.Tensor]) -> None:
        self.model.load_state_dict({k: v.to(self.device) for k, v in w.items()})
        self.weights_hash = param_hash(w)

    def get_state(self, name: str) -> Any:
        if name != "weights":
            raise KeyError(f"Generator has no state {name!r} (it has: weights)")
        return clone_weights(self.model)

    def set_state(self, name: str, value: Any) -> None:
        if name != "weights":
            raise KeyError(f"Generator has no state {name!r} (it has: weights)")
        self.weights = value

    def load_weights(self, w: Mapping[str, torch.Tensor], hash: str) -> None:
        """Refresh the rollout weights from the learner, after checking their sha256 parameter hash.

        A mismatch means the sync corrupted or mixed up weights; sampling from them would silently
        produce off-policy rollouts, so it is an error, and the old weights stay in place.
        """
        got = param_hash(w)
        if got != hash:
            raise WeightSyncError(
                f"Generator.load_weights: received weights hash to {got[:16]}..., but the learner "
                f"published {str(hash)[:16]}...; refusing to generate from unverified weights"
            )
        self.model.load_state_dict({k: v.to(self.device) for k, v in w.items()})
        self.weights_hash = got
        self.version += 1

    # -- generation ----------------------------------------------------------------------------------
    def generate(self, prompts: Record, it: int, rows: slice | None = None) -> dict[str, Record]:
        """K completions for each prompt. Returns `{"rollouts": record}`, prompts on dim 0:

        prompt [P, Lp], prompt_len [P], answer [P], index [P] (passed through); tokens [P, K, L]
        (completion ids, PAD after the end; L = max_new_tokens); logp [P, K, L] (sampling log-probs,
        0 outside the mask); mask [P, K, L] (completion tokens, EOS included); lengths [P, K];
        finished [P, K] (ended by EOS rather than by the length limit); temperature [P]; version [P, K]
        (the policy version that sampled it: the number of weight syncs received); no_eos [P] (the lengths
        were forced: EOS was banned until the drawn length, then ended the completion unsampled -- it is
        not stored in tokens; `finished` is then True).
        """
        start = 0 if rows is None or rows.start is None else int(rows.start)
        tokens, plen = prompts["tokens"], prompts["lengths"].long()
        p_count = tokens.shape[0]
        ids = prompts["index"].tolist() if "index" in prompts else list(range(start, start + p_count))
        limit = self.spec.context - self.max_new_tokens
        for r, n in enumerate(plen.tolist()):
            if not 1 <= n <= limit:
                raise ValueError(
                    f"Generator.generate: prompt row {start + r} has {n} tokens; with max_new_tokens="
                    f"{self.max_new_tokens} and context {self.spec.context} a prompt must have 1..{limit}"
                )
        bad = ((tokens < 0) | (tokens >= self.tokenizer.vocab_size)).any(dim=1).nonzero().flatten().tolist()
        if bad:
            raise ValueError(f"Generator.generate: prompt row {start + bad[0]} has token ids outside the vocabulary")
        t0 = time.perf_counter()
        u = uniform_streams(self.seed, int(it), ids, self.k, self.max_new_tokens)
        forced = None if self.lengths is None else forced_lengths(
            self.seed, int(it), ids, self.k, *self.lengths, self.max_new_tokens)
        out = self._run(tokens, plen, u, forced)
        seconds = time.perf_counter() - t0
        out.update(
            prompt=tokens.clone(), prompt_len=plen.clone(),
            temperature=torch.full((p_count,), self.temperature, dtype=torch.float32),
            index=torch.tensor(ids, dtype=torch.long),
            version=torch.full((p_count, self.k), self.version, dtype=torch.long),
            no_eos=torch.full((p_count,), forced is not None, dtype=torch.bool),
        )
        if "answer" in prompts:
            out["answer"] = prompts["answer"].clone()
        self._record_metrics(out, seconds)
        return {"rollouts": out}

    @torch.no_grad()
    def _run(self, tokens: torch.Tensor, plen: torch.Tensor, u: torch.Tensor, forced: torch.Tensor | None) -> Record:
        """The scheduler: admit (prompt, sample) work into free slots, decode, retire finished rows.

        A finished row frees its slot at once and the next waiting (prompt, sample) takes it (the lowest
        free slot first, which keeps the slots in use a prefix on the GPU). `forced` [P, K]: each
        completion's drawn length (EOS banned until then); None: the policy's EOS or `max_new_tokens`.
        """
        p_count, k = tokens.shape[0], self.k
        slots = min(self.max_batch, p_count * k)
        run = _Run(self, p_count, slots, forced)
        queue = deque((p, j) for p in range(p_count) for j in range(k))
        prefixes: dict[int, list[Any]] = {}  # prompt -> [logits, k, v, samples not yet admitted]
        while queue or run.active:
            while run.free and queue:  # admission: refill the free slots from the pending work
                p, js = queue[0][0], []
                while queue and queue[0][0] == p and len(js) < len(run.free):
                    js.append(queue.popleft()[1])
                if p not in prefixes:
                    with self._autocast():
                        logits, kv_k, kv_v = self.model.prefill(tokens[p, : plen[p]].to(self.device))
                    prefixes[p] = [logits.float().unsqueeze(0), kv_k, kv_v, k]
                    run.n_prefill += 1
                entry = prefixes[p]
                run.admit(p, torch.tensor(js), entry, int(plen[p]), u)
                entry[3] -= len(js)
                if entry[3] == 0:
                    del prefixes[p]  # the shared prefix is released once its last sample is admitted
            if run.active:
                run.step(u)
        self._sched = {"prefills": run.n_prefill, "decode_steps": run.n_steps, "slot_occupancy": run.occupancy}
        return run.record()

    def _autocast(self) -> torch.autocast:
        """bf16 autocast on CUDA; a disabled context on the CPU (fp32, bit-reproducible)."""
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda")

    # -- metrics -------------------------------------------------------------------------------------
    def _record_metrics(self, out: Record, seconds: float) -> None:
        m = self._metrics
        m["tokens"] = m.get("tokens", 0.0) + float(out["mask"].sum())
        m["seconds"] = m.get("seconds", 0.0) + seconds
        m["sequences"] = m.get("sequences", 0.0) + float(out["lengths"].numel())
        m["eos"] = m.get("eos", 0.0) + float(out["finished"].sum())
        for key, val in self._sched.items():
            m[key] = m.get(key, 0.0) + val

    def pop_metrics(self) -> dict[str, float]:
        """Tokens generated, tokens/s, mean completion length, EOS rate, mean active decode slots."""
        m, self._metrics = self._metrics, {}
        if not m:
            return {}
        seqs = max(m["sequences"], 1.0)
        return {
            "tokens": m["tokens"],
            "tokens_per_s": m["tokens"] / max(m["seconds"], 1e-9),
            "mean_completion_len": m["tokens"] / seqs,
            "eos_rate": m["eos"] / seqs,
            "prefills": m["prefills"],
            "mean_active_slots": m["slot_occupancy"] / max(m["decode_steps"], 1.0),
            "weights_version": float(self.version),
        }


class _Run:
    """The decode slots of one `generate` call and the completions they write (see `Generator._run`)."""

    def __init__(self, gen: Generator, p_count: int, slots: int, forced: torch.Tensor | None) -> None:
        self.gen, k, length = gen, gen.k, gen.max_new_tokens
        self.limit = forced if forced is not None else torch.full((p_count, k), length, dtype=torch.long)
        self.ban = gen.tokenizer.eos_id if forced is not None else None
        self.tok = torch.full((p_count, k, length), gen.tokenizer.pad_id, dtype=torch.long)
        self.logp = torch.zeros(p_count, k, length)
        self.finished = torch.zeros(p_count, k, dtype=torch.bool)
        self.lengths = torch.zeros(p_count, k, dtype=torch.long)
        # per slot: which (prompt, sample) it holds, tokens emitted, next input and its position
        self.s_prompt, self.s_sample, self.s_step, self.s_token, self.s_pos = (
            torch.zeros(slots, dtype=torch.long) for _ in range(5))
        self.free, self.active = list(range(slots)), set()  # `free` is a heap: the lowest slot first
        self.cache: Any = None
        self.slots = slots
        self.n_prefill = self.n_steps = self.occupancy = 0

    def _sample(self, logits: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gen = self.gen
        logits = allowed_logits(logits.float(), gen.tokenizer.vocab_size, self.ban)
        tok, lp = sample_rows(logits, u, gen.temperature, gen.top_p)
        return tok.cpu(), lp.cpu()

    def _ends(self, tok: torch.Tensor, ps: torch.Tensor, js: torch.Tensor, emitted: torch.Tensor) -> torch.Tensor:
        """Record which rows end now (EOS sampled, or their length reached) and return that mask."""
        eos = (tok == self.gen.tokenizer.eos_id) if self.ban is None else torch.zeros_like(tok, dtype=torch.bool)
        at_limit = emitted == self.limit[ps, js]
        self.finished[ps, js] = eos | (at_limit if self.ban is not None else eos)
        return eos | at_limit

    def admit(self, p: int, jt: torch.Tensor, entry: list[Any], plen: int, u: torch.Tensor) -> None:
        """Samples `jt` of prompt p: their first token from the shared prefill, then a slot each if they go on."""
        tok, lp = self._sample(entry[0].expand(len(jt), -1), u[p, jt, 0])
        self.tok[p, jt, 0], self.logp[p, jt, 0], self.lengths[p, jt] = tok, lp, 1
        go_on = ~self._ends(tok, torch.full_like(jt, p), jt, torch.ones_like(jt))
        new = torch.tensor([heapq.heappop(self.free) for _ in range(int(go_on.sum()))], dtype=torch.long)
        if not len(new):
            return
        if self.cache is None:
            self.cache = self.gen.model.new_cache(self.slots, self.gen.device, entry[1].dtype)
        self.cache.load_prefix(new.to(self.gen.device), entry[1], entry[2])  # expand the prefix KV, no recompute
        self.s_prompt[new], self.s_sample[new], self.s_step[new] = p, jt[go_on], 1
        self.s_token[new], self.s_pos[new] = tok[go_on], plen
        self.active.update(new.tolist())

    def step(self, u: torch.Tensor) -> None:
        """One decode step of every active slot; finished rows free their slots."""
        gen, dev = self.gen, self.gen.device
        act = torch.tensor(sorted(self.active), dtype=torch.long)
        with gen._autocast():
            if gen.row_invariant:  # the active slots, row by row (CPU: split invariance)
                logits = gen.model.decode(self.s_token[act].to(dev), self.s_pos[act].to(dev), self.cache,
                                          act.to(dev), True)
            else:  # the prefix of slots up to the highest in use, as views of the cache (GPU)
                hi = int(act[-1]) + 1
                logits = gen.model.decode(self.s_token[:hi].to(dev), self.s_pos[:hi].to(dev), self.cache, None,
                                          False)[act.to(dev)]
        ps, js, ts = self.s_prompt[act], self.s_sample[act], self.s_step[act]
        tok, lp = self._sample(logits, u[ps, js, ts])
        self.tok[ps, js, ts], self.logp[ps, js, ts], self.lengths[ps, js] = tok, lp, ts + 1
        done = self._ends(tok, ps, js, ts + 1)
        self.s_token[act], self.s_pos[act], self.s_step[act] = tok, self.s_pos[act] + 1, ts + 1
        for slot in act[done].tolist():
            self.active.discard(slot)
            heapq.heappush(self.free, slot)
            self.s_token[slot], self.s_pos[slot] = 0, 0  # an idle slot in the GPU prefix writes at position 0
        self.n_steps += 1
        self.occupancy += len(act)

    def record(self) -> Record:
        length = self.gen.max_new_tokens
        mask = torch.arange(length).view(1, 1, -1) < self.lengths.unsqueeze(-1)
        return {
            "tokens": self.tok.masked_fill(~mask, self.gen.tokenizer.pad_id), "logp": self.logp * mask,
            "mask": mask, "lengths": self.lengths, "finished": self.finished,
        }
