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

import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import torch

from examples.llm.model import KVCache
from examples.llm.policy import PolicySpec, build_policy, clone_weights, param_hash
from examples.llm.sampling import sample_rows, uniform_streams
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
        self.k, self.max_new_tokens, self.max_batch = int(k), int(max_new_tokens), int(max_batch)
        self.temperature, self.top_p, self.seed = float(temperature), float(top_p), int(seed)
        self.device = torch.device(device)
        self.tokenizer = CharTokenizer()
        self.tokenizer_hash = self.tokenizer.hash()
        if tokenizer_hash is not None:
            self.tokenizer.check(tokenizer_hash, "Generator")
        self.model = build_policy(self.spec, self.seed, self.device, cache_dir).eval()
        # bit-exact row invariance is a CPU property; on CUDA use the fast kernels (and bf16 autocast)
        self.row_invariant = self.device.type == "cpu"
        self.weights_hash = param_hash(self.model.state_dict())
        self.version = 0
        self._metrics: dict[str, float] = {}

    # -- state ---------------------------------------------------------------------------------------
    @property
    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    @weights.setter
    def weights(self, w: Mapping[str, torch.Tensor]) -> None:
        self.model.load_state_dict({k: v.to(self.device) for k, v in w.items()})
        self.weights_hash = param_hash(self.model.state_dict())

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
        finished [P, K] (ended by EOS rather than by the length limit); temperature [P].
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
        out = self._run(tokens, plen, u)
        seconds = time.perf_counter() - t0
        out.update(
            prompt=tokens.clone(), prompt_len=plen.clone(),
            temperature=torch.full((p_count,), self.temperature, dtype=torch.float32),
            index=torch.tensor(ids, dtype=torch.long),
        )
        if "answer" in prompts:
            out["answer"] = prompts["answer"].clone()
        self._record_metrics(out, seconds)
        return {"rollouts": out}

    @torch.no_grad()
    def _run(self, tokens: torch.Tensor, plen: torch.Tensor, u: torch.Tensor) -> Record:
        """The scheduler: admit (prompt, sample) work into free slots, decode, retire finished rows."""
        p_count, k, length, dev = tokens.shape[0], self.k, self.max_new_tokens, self.device
        eos = self.tokenizer.eos_id
        out_tok = torch.full((p_count, k, length), self.tokenizer.pad_id, dtype=torch.long)
        out_logp = torch.zeros(p_count, k, length)
        finished = torch.zeros(p_count, k, dtype=torch.bool)
        lengths = torch.zeros(p_count, k, dtype=torch.long)
        queue = deque((p, j) for p in range(p_count) for j in range(k))
        slots = min(self.max_batch, p_count * k)
        # per-slot bookkeeping: which (prompt, sample) it holds, tokens emitted, next input and position
        s_prompt = torch.zeros(slots, dtype=torch.long)
        s_sample = torch.zeros(slots, dtype=torch.long)
        s_step = torch.zeros(slots, dtype=torch.long)
        s_token = torch.zeros(slots, dtype=torch.long)
        s_pos = torch.zeros(slots, dtype=torch.long)
        free, active = list(range(slots)), set()
        prefixes: dict[int, list[Any]] = {}  # prompt -> [logits, k, v, samples not yet admitted]
        cache: KVCache | None = None
        n_prefill = n_steps = occupancy = 0

        while queue or active:
            while free and queue:  # admission: refill the free slots from the pending work
                p, js = queue[0][0], []
                while queue and queue[0][0] == p and len(js) < len(free):
                    js.append(queue.popleft()[1])
                if p not in prefixes:
                    with self._autocast():
                        logits, kv_k, kv_v = self.model.prefill(tokens[p, : plen[p]].to(dev))
                    prefixes[p] = [logits.float().unsqueeze(0), kv_k, kv_v, k]
                    n_prefill += 1
                entry, jt = prefixes[p], torch.tensor(js)
                # the first token of each sample comes from the shared prefill's logits
                tok, lp = sample_rows(entry[0].expand(len(js), -1), u[p, jt, 0], self.temperature, self.top_p)
                tok, lp = tok.cpu(), lp.cpu()
                out_tok[p, jt, 0], out_logp[p, jt, 0], lengths[p, jt] = tok, lp, 1
                finished[p, jt] = tok == eos
                go_on = (tok != eos) & (length > 1)  # the others finished on their first token
                new = torch.tensor([free.pop() for _ in range(int(go_on.sum()))], dtype=torch.long)
                if len(new):
                    if cache is None:
                        cache = KVCache(self.model.cfg, slots, dev, entry[1].dtype)
                    cache.load_prefix(new.to(dev), entry[1], entry[2])  # expand the prefix KV, no recompute
                    s_prompt[new], s_sample[new], s_step[new] = p, jt[go_on], 1
                    s_token[new], s_pos[new] = tok[go_on], plen[p]
                    active.update(new.tolist())
                entry[3] -= len(js)
                if entry[3] == 0:
                    del prefixes[p]  # the shared prefix is released once its last sample is admitted
            if not active:
                continue
            act = torch.tensor(sorted(active), dtype=torch.long)
            with self._autocast():
                logits = self.model.decode(
                    s_token[act].to(dev), s_pos[act].to(dev), cache, act.to(dev), self.row_invariant
                )
            ps, js, ts = s_prompt[act], s_sample[act], s_step[act]
            tok, lp = sample_rows(logits.float(), u[ps, js, ts], self.temperature, self.top_p)
            tok, lp = tok.cpu(), lp.cpu()
            out_tok[ps, js, ts], out_logp[ps, js, ts], lengths[ps, js] = tok, lp, ts + 1
            done = (tok == eos) | (ts + 1 == length)
            finished[ps, js] = tok == eos
            s_token[act], s_pos[act], s_step[act] = tok, s_pos[act] + 1, ts + 1
            for slot in act[done].tolist():
                active.discard(slot)
                free.append(slot)
            n_steps += 1
            occupancy += len(act)
        mask = torch.arange(length).view(1, 1, -1) < lengths.unsqueeze(-1)
        self._sched = {"prefills": n_prefill, "decode_steps": n_steps, "slot_occupancy": occupancy}
        return {
            "tokens": out_tok.masked_fill(~mask, self.tokenizer.pad_id), "logp": out_logp * mask,
            "mask": mask, "lengths": lengths, "finished": finished,
        }

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
