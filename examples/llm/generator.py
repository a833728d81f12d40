"""Generator: K completions per prompt with prefix sharing and continuous batching (`generator.generate`,
or `generator.submit` then `generator.collect` per row group).

The shape of the work follows the lecture's rollout engine, scaled down:
- one prefill per prompt; its KV cache is copied into the decode slots of the prompt's K samples
  (expanded, never recomputed) and released once the last of the K samples has been admitted;
- a fixed number of decode slots (`max_batch`); after every decode step, sequences that emitted EOS or
  reached `max_new_tokens` free their slot, and pending (prompt, sample) work takes it at once;
- per-token sampling log-probs are recorded alongside the tokens (the PPO ratio's pi_old), and each
  sample's policy version (weight syncs received);
- the completions in flight outlive a call: `submit` queues prompts, `collect` decodes every queued
  completion until the rows it asks for are finished, so the rows of one group can be returned while
  the others keep decoding (the long-tail overlap; README);
- optionally, each completion's length is forced (`length_mean`, `length_p99`): drawn from a lognormal
  per (seed, it, prompt id, sample), EOS banned until then -- a systems stand-in for long-tail lengths;
- optionally, partial rollouts (`partial_rollouts: B`, issue 46): a weight sync (`load_weights`) may come
  while completions are in flight (prompts submitted for a later iteration, decoding beside this one's);
  they continue under the new weights -- their KV cache as computed, each later token sampled by the new
  policy -- and each token records the policy version that sampled it (`version` [P, K, L] instead of
  [P, K]). B bounds the oldest token's lag: at a sync, a prompt group in flight whose oldest token would be
  more than B versions old is restarted from its prompt under the new weights (its tokens dropped, never
  cut short: a truncated completion would be scored as a wrong answer and bias the batch toward short
  ones). 0 (the default): a sync with completions in flight is an error, as before.

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

from examples.llm.decode_graphs import DecodeGraphs
from examples.llm.decoder import Decoder
from examples.llm.policy import PolicySpec, build_policy, clone_weights, param_hash, params_to
from examples.llm.sampling import (
    allowed_logits,
    forced_lengths,
    lognormal_params,
    sample_rows,
    uniform_streams,
)
from examples.llm.tokenizer import CharTokenizer

Record = dict[str, torch.Tensor]


class WeightSyncError(RuntimeError):
    """The weights received by `load_weights` do not hash to the hash the learner published."""


class Generator:
    """The rollout policy. State `weights`: the parameters (refreshed by `load_weights`) and their policy version."""

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
        cuda_graphs: bool = True,
        partial_rollouts: int = 0,
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
        if int(partial_rollouts) < 0:
            raise ValueError(f"Generator: partial_rollouts (the oldest token's lag allowed) must be >= 0, got {partial_rollouts}")
        self.partial = int(partial_rollouts)
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
        # decode steps replayed from CUDA graphs (decode_graphs.py); eager on the CPU or when turned off
        self.cuda_graphs = bool(cuda_graphs) and self.device.type == "cuda"
        if self.device.type == "cuda":
            params_to(self.model, torch.bfloat16)
        self.version = 0
        self._metrics: dict[str, float] = {}
        self._flight = _Flight(self)  # the completions being decoded (across `submit`/`collect` calls)

    # -- state ---------------------------------------------------------------------------------------
    @property
    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    @weights.setter
    def weights(self, w: Mapping[str, torch.Tensor]) -> None:
        self.model.load_state_dict({k: v.to(self.device) for k, v in w.items()})
        self.weights_hash = param_hash(w)

    def get_state(self, name: str) -> Any:
        """`weights`: the parameters and their policy version (the weight syncs received), which the
        learner's staleness is measured against -- so a restore puts both back together."""
        if name != "weights":
            raise KeyError(f"Generator has no state {name!r} (it has: weights)")
        return {"params": clone_weights(self.model), "version": self.version}

    def set_state(self, name: str, value: Any) -> None:
        """A restore (a checkpoint, a recovery, an optimizer trial's snapshot), not a weight sync: the
        version is the one saved with the weights (a plain parameter dict, an older checkpoint's: 0, as the
        learner's published count from one). Completions in flight are dropped: they are not part of the value
        (a checkpoint is taken after a drain, with none in flight), and those of a process that survived a
        recovery were queued in the timeline the recovery abandoned."""
        if name != "weights":
            raise KeyError(f"Generator has no state {name!r} (it has: weights)")
        params, version = (value["params"], value["version"]) if set(value) == {"params", "version"} else (value, 0)
        self.weights = params
        self.version = int(version)
        self._flight.discard()

    def load_weights(self, w: Mapping[str, torch.Tensor], hash: str) -> None:
        """Refresh the rollout weights from the learner, after checking their sha256 parameter hash.

        A mismatch means the sync corrupted or mixed up weights; sampling from them would silently
        produce off-policy rollouts, so it is an error, and the old weights stay in place.
        """
        if self._flight.rows_in_flight() and not self.partial:
            raise RuntimeError(
                "Generator.load_weights: completions submitted under the current weights are not collected yet; "
                "a weight sync must come after the `collect` of every submitted prompt (or allow partial "
                "rollouts: partial_rollouts > 0)"
            )
        got = param_hash(w)
        if got != hash:
            raise WeightSyncError(
                f"Generator.load_weights: received weights hash to {got[:16]}..., but the learner "
                f"published {str(hash)[:16]}...; refusing to generate from unverified weights"
            )
        self.model.load_state_dict({k: v.to(self.device) for k, v in w.items()})
        self.weights_hash = got
        self.version += 1
        if self.partial:  # what continues under the new weights, within the bound on its oldest token
            self._flight.restart_stale(self.version - self.partial)

    # -- generation ----------------------------------------------------------------------------------
    def generate(self, prompts: Record, it: int, rows: slice | None = None) -> dict[str, Record]:
        """K completions for each prompt (`submit` and `collect` in one call). Returns `{"rollouts": record}`,
        prompts on dim 0:

        prompt [P, Lp], prompt_len [P], answer [P], index [P] (passed through); tokens [P, K, L]
        (completion ids, PAD after the end; L = max_new_tokens); logp [P, K, L] (sampling log-probs,
        0 outside the mask); mask [P, K, L] (completion tokens, EOS included); lengths [P, K];
        finished [P, K] (ended by EOS rather than by the length limit); temperature [P]; version [P, K]
        (the policy version that sampled it: the number of weight syncs received); no_eos [P] (the lengths
        were forced: EOS was banned until the drawn length, then ended the completion unsampled -- it is
        not stored in tokens; `finished` is then True).
        """
        return self.collect(prompts, it, rows)

    def submit(self, prompts: Record, it: int, rows: slice | None = None) -> dict[str, Record]:
        """Queue the K samples of each prompt for decoding and pass the prompts on (`{"pending": prompts}`).

        Decoding happens in `collect` calls, which decode every queued completion (continuous batching over
        all of them, in submission order) until the ones they ask for are finished. A plan that splits
        `collect` into row groups therefore gets group g's rollouts as soon as group g is finished, while
        the other groups' completions go on decoding in the next `collect`: group g's scoring overlaps the
        generation of the rest (the long-tail overlap), and the tokens are the same as one `generate`.
        """
        self._flight.add(prompts, int(it), self._prompt_ids(prompts, rows))
        return {"pending": prompts}

    def collect(self, pending: Record, it: int, rows: slice | None = None) -> dict[str, Record]:
        """The rollouts of `pending`'s prompts (queued first if `submit` did not), decoded to their end."""
        ids = self._prompt_ids(pending, rows)
        t0 = time.perf_counter()
        keys = self._flight.add(pending, int(it), ids)
        self._flight.run_until(keys)
        out = self._flight.take(keys)
        seconds = time.perf_counter() - t0
        p_count = len(ids)
        out.update(
            prompt=pending["tokens"].clone(), prompt_len=pending["lengths"].long().clone(),
            temperature=torch.full((p_count,), self.temperature, dtype=torch.float32),
            index=torch.tensor(ids, dtype=torch.long),
            version=out.pop("token_version") if self.partial else torch.full((p_count, self.k), self.version,
                                                                                 dtype=torch.long),
            no_eos=torch.full((p_count,), self.lengths is not None, dtype=torch.bool),
        )
        if "answer" in pending:
            out["answer"] = pending["answer"].clone()
        self._record_metrics(out, seconds)
        return {"rollouts": out}

    def _prompt_ids(self, prompts: Record, rows: slice | None) -> list[int]:
        """The prompts' stream ids (their `index`, else their rows), after checking the prompts fit."""
        start = int(rows.start or 0) if isinstance(rows, slice) else 0
        tokens, plen = prompts["tokens"], prompts["lengths"].long()
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
        return prompts["index"].tolist() if "index" in prompts else list(range(start, start + tokens.shape[0]))

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
        for key, val in self._flight.pop_counts().items():
            m[key] = m.get(key, 0.0) + val

    def pop_metrics(self) -> dict[str, float]:
        """Tokens generated, tokens/s, mean completion length, EOS rate, mean active decode slots."""
        m, self._metrics = self._metrics, {}
        if not m:
            return {}
        seqs = max(m["sequences"], 1.0)
        return {
            "tokens": m["tokens"],
            "generated_tokens": m["tokens"],  # (a name no other component writes: the paper table's work metric)
            "tokens_per_s": m["tokens"] / max(m["seconds"], 1e-9),
            "mean_completion_len": m["tokens"] / seqs,
            "eos_rate": m["eos"] / seqs,
            "prefills": m["prefills"],
            "mean_active_slots": m["slot_occupancy"] / max(m["decode_steps"], 1.0),
            "weights_version": float(self.version),
            **({"partial_restarts": m.get("restarts", 0.0)} if self.partial else {}),
        }



class _Flight:
    """Every completion submitted and not yet collected, and the decode slots they share.

    Rows (one per (iteration, prompt, sample)) live in flat arrays in submission order; a slot holds one
    row. The KV cache has `max_batch` slots, allocated once at the first admission and reused by every
    call (a finished row frees its slot at once; the next queued row takes the lowest free slot, which
    keeps the slots in use a prefix of the cache for the GPU's decode).
    """

    def __init__(self, gen: Generator) -> None:
        self.gen = gen
        self.slots = gen.max_batch
        self.cache: Any = None
        self.graphs: DecodeGraphs | None = None
        self.s_row, self.s_step, self.s_token, self.s_pos = (torch.zeros(self.slots, dtype=torch.long) for _ in range(4))
        self.free: list[int] = list(range(self.slots))  # a heap: the lowest slot first
        self.active: set[int] = set()
        self.counts = {"prefills": 0, "decode_steps": 0, "slot_occupancy": 0}
        self._reset()

    def _reset(self) -> None:
        length = self.gen.max_new_tokens
        self.tok = torch.zeros(0, length, dtype=torch.long)
        self.logp, self.u = torch.zeros(0, length), torch.zeros(0, length, dtype=torch.float64)
        self.limit, self.lengths = torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
        self.finished, self.done = torch.zeros(0, dtype=torch.bool), torch.zeros(0, dtype=torch.bool)
        self.ver = torch.zeros(0, length, dtype=torch.long)  # the policy version that sampled each token
        self.rows: dict[tuple[int, int], int] = {}  # (it, prompt id) -> its first row (K rows each)
        self.prompt_of: list[tuple[int, int]] = []
        self.prompt_data: dict[tuple[int, int], tuple[torch.Tensor, int]] = {}
        self.queue: deque[int] = deque()
        self.prefixes: dict[tuple[int, int], list[Any]] = {}  # prompt -> [logits, k, v, samples not admitted]
        self.taken = 0

    def discard(self) -> None:
        """Forget every completion in flight (a restore); the KV cache and the decode graphs are kept."""
        self.free, self.active = list(range(self.slots)), set()
        self.s_token.zero_()
        self.s_pos.zero_()
        self._reset()

    def rows_in_flight(self) -> bool:
        return self.taken < len(self.prompt_of)

    def pop_counts(self) -> dict[str, int]:
        out, self.counts = self.counts, dict.fromkeys(self.counts, 0)
        return out

    def add(self, prompts: Record, it: int, ids: list[int]) -> list[tuple[int, int]]:
        """Queue the K rows of each prompt not in flight yet; returns the prompts' keys."""
        gen, k = self.gen, self.gen.k
        keys = [(it, pid) for pid in ids]
        new = [r for r, key in enumerate(keys) if key not in self.rows]
        if not new:
            return keys
        new_ids = [ids[r] for r in new]
        u = uniform_streams(gen.seed, it, new_ids, k, gen.max_new_tokens)
        limit = (torch.full((len(new), k), gen.max_new_tokens, dtype=torch.long) if gen.lengths is None
                 else forced_lengths(gen.seed, it, new_ids, k, *gen.lengths, gen.max_new_tokens))
        first = len(self.prompt_of)
        plen = prompts["lengths"].long()
        for n, r in enumerate(new):
            self.rows[keys[r]] = first + n * k
            self.prompt_data[keys[r]] = (prompts["tokens"][r, : int(plen[r])], int(plen[r]))
            self.prompt_of += [keys[r]] * k
        count = len(new) * k
        self.tok = torch.cat([self.tok, torch.full((count, gen.max_new_tokens), gen.tokenizer.pad_id)])
        self.logp = torch.cat([self.logp, torch.zeros(count, gen.max_new_tokens)])
        self.u = torch.cat([self.u, u.reshape(count, -1)])
        self.limit = torch.cat([self.limit, limit.reshape(-1)])
        self.lengths = torch.cat([self.lengths, torch.zeros(count, dtype=torch.long)])
        self.finished = torch.cat([self.finished, torch.zeros(count, dtype=torch.bool)])
        self.done = torch.cat([self.done, torch.zeros(count, dtype=torch.bool)])
        self.ver = torch.cat([self.ver, torch.zeros(count, gen.max_new_tokens, dtype=torch.long)])
        self.queue.extend(range(first, first + count))
        return keys

    def _rows_of(self, keys: list[tuple[int, int]]) -> torch.Tensor:
        return torch.cat([torch.arange(self.rows[key], self.rows[key] + self.gen.k) for key in keys]) \
            if keys else torch.zeros(0, dtype=torch.long)

    def run_until(self, keys: list[tuple[int, int]]) -> None:
        """Admit and decode (every row in flight) until the rows of `keys` are all finished."""
        want = self._rows_of(keys)
        while not bool(self.done[want].all()):
            self._admit()
            if self.active:
                self._step()

    def take(self, keys: list[tuple[int, int]]) -> Record:
        """The finished rollouts of `keys` ([P, K, L] record fields); the flight forgets nothing else."""
        rows, (p, k, length) = self._rows_of(keys), (len(keys), self.gen.k, self.gen.max_new_tokens)
        lengths = self.lengths[rows]
        mask = torch.arange(length).view(1, -1) < lengths.unsqueeze(-1)
        out = {
            "tokens": self.tok[rows].masked_fill(~mask, self.gen.tokenizer.pad_id).view(p, k, length),
            "logp": (self.logp[rows] * mask).view(p, k, length), "mask": mask.view(p, k, length),
            "lengths": lengths.view(p, k), "finished": self.finished[rows].view(p, k),
        }
        if self.gen.partial:  # each token's sampling version; after the end, the last token's (never older)
            last = self.ver[rows, (lengths - 1).clamp(min=0)].unsqueeze(-1)
            out["token_version"] = torch.where(mask, self.ver[rows], last).view(p, k, length)
        for key in keys:
            self.rows.pop(key)
        self.taken += len(rows)
        if not self.rows_in_flight():
            self._reset()
        elif 2 * self.taken >= len(self.prompt_of):
            self._compact()
        return out

    def _compact(self) -> None:
        """Drop the rows already taken, renumbering the rest (the slots', the queue's and the prompts' row
        indices with them). Without it, a flight never empty between calls -- partial rollouts, where the next
        iteration's prompts are always queued -- would keep every row it ever held (~60 MB of per-token arrays
        per iteration of the long-tail workload) and copy all of them at each `add`. Taking half of the rows
        before each compaction keeps the copying linear in the rows added. Pure renumbering: the tokens,
        log-probs and sampling streams of the rows in flight are unchanged."""
        k = self.gen.k
        live = torch.cat([torch.arange(first, first + k) for first in self.rows.values()]).sort().values
        renumber = torch.full((len(self.prompt_of),), -1, dtype=torch.long)
        renumber[live] = torch.arange(len(live))
        for name in ("tok", "logp", "u", "limit", "lengths", "finished", "done", "ver"):
            setattr(self, name, getattr(self, name)[live])
        self.prompt_of = [self.prompt_of[r] for r in live.tolist()]
        self.rows = {key: int(renumber[first]) for key, first in self.rows.items()}
        self.queue = deque(int(renumber[r]) for r in self.queue)
        for slot in self.active:
            self.s_row[slot] = renumber[self.s_row[slot]]
        self.taken = 0

    def restart_stale(self, oldest: int) -> list[tuple[int, int]]:
        """At a weight sync (partial rollouts): every prompt group in flight holding a token sampled before
        version `oldest` starts again from its prompt -- its rows leave their slots, lose their tokens and
        go back to the front of the queue (the prefill runs again, under the new weights). The groups
        restarted."""
        stale = []
        for key, first in self.rows.items():
            rows = torch.arange(first, first + self.gen.k)
            started = self.lengths[rows] > 0
            if bool(started.any()) and int(self.ver[rows][started][:, 0].min()) < oldest:
                stale.append(key)
        for key in stale:
            first = self.rows[key]
            rows = set(range(first, first + self.gen.k))
            for slot in [s for s in self.active if int(self.s_row[s]) in rows]:
                self.active.discard(slot)
                heapq.heappush(self.free, slot)
                self.s_token[slot], self.s_pos[slot] = 0, 0
            self.queue = deque(r for r in self.queue if r not in rows)
            self.queue.extendleft(reversed(range(first, first + self.gen.k)))
            sl = slice(first, first + self.gen.k)
            self.tok[sl], self.logp[sl], self.ver[sl] = self.gen.tokenizer.pad_id, 0.0, 0
            self.lengths[sl], self.finished[sl], self.done[sl] = 0, False, False
            self.prefixes.pop(key, None)
            self.counts["restarts"] = self.counts.get("restarts", 0) + 1
        return stale

    def _sample(self, logits: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gen = self.gen
        ban = gen.tokenizer.eos_id if gen.lengths is not None else None
        tok, lp = sample_rows(allowed_logits(logits.float(), gen.tokenizer.vocab_size, ban), u, gen.temperature,
                              gen.top_p)
        return tok.cpu(), lp.cpu()

    def _record(self, rows: torch.Tensor, steps: torch.Tensor, tok: torch.Tensor, lp: torch.Tensor) -> torch.Tensor:
        """Store the tokens sampled at `steps` of `rows`; mark and return the rows that end with them."""
        self.tok[rows, steps], self.logp[rows, steps], self.lengths[rows] = tok, lp, steps + 1
        self.ver[rows, steps] = self.gen.version
        at_limit = steps + 1 == self.limit[rows]
        if self.gen.lengths is None:
            eos = tok == self.gen.tokenizer.eos_id
            self.finished[rows] = eos
            ends = eos | at_limit
        else:  # forced lengths: EOS was banned, the drawn length ends the row (and counts as finished)
            self.finished[rows] = at_limit
            ends = at_limit
        self.done[rows[ends]] = True
        return ends

    def _admit(self) -> None:
        """Refill the free slots from the queue; a prompt's first admission runs its (shared) prefill."""
        gen, queue = self.gen, self.queue
        while self.free and queue:
            key, rows = self.prompt_of[queue[0]], []
            while queue and self.prompt_of[queue[0]] == key and len(rows) < len(self.free):
                rows.append(queue.popleft())
            if key not in self.prefixes:
                tokens, _ = self.prompt_data[key]
                with gen._autocast():
                    logits, kv_k, kv_v = gen.model.prefill(tokens.to(gen.device))
                self.prefixes[key] = [logits.float().unsqueeze(0), kv_k, kv_v, gen.k]
                self.counts["prefills"] += 1
            entry, rt = self.prefixes[key], torch.tensor(rows, dtype=torch.long)
            # the first token of each sample comes from the shared prefill's logits
            tok, lp = self._sample(entry[0].expand(len(rows), -1), self.u[rt, 0])
            go_on = ~self._record(rt, torch.zeros_like(rt), tok, lp)
            self._occupy(rt[go_on], tok[go_on], entry, self.prompt_data[key][1])
            entry[3] -= len(rows)
            if entry[3] == 0:
                del self.prefixes[key]  # the shared prefix is released once its last sample is admitted

    def _occupy(self, rows: torch.Tensor, tok: torch.Tensor, entry: list[Any], plen: int) -> None:
        if not len(rows):
            return
        gen = self.gen
        new = torch.tensor([heapq.heappop(self.free) for _ in range(len(rows))], dtype=torch.long)
        if self.cache is None:
            self.cache = gen.model.new_cache(self.slots, gen.device, entry[1].dtype)
            # the graphs need a fixed-shape decode (`span`): the 0.5B-shaped Decoder has it, TinyLM does not
            self.graphs = DecodeGraphs(gen.model, self.cache) if gen.cuda_graphs and isinstance(gen.model, Decoder) \
                else None
        self.cache.load_prefix(new.to(gen.device), entry[1], entry[2])  # expand the prefix KV, no recompute
        self.s_row[new], self.s_step[new], self.s_token[new], self.s_pos[new] = rows, 1, tok, plen
        self.active.update(new.tolist())

    def _step(self) -> None:
        """One decode step of every active slot; finished rows free their slots."""
        gen, dev = self.gen, self.gen.device
        act = torch.tensor(sorted(self.active), dtype=torch.long)
        with gen._autocast():
            if gen.row_invariant:  # the active slots, row by row (CPU: split invariance)
                logits = gen.model.decode(self.s_token[act].to(dev), self.s_pos[act].to(dev), self.cache,
                                          act.to(dev), True)
            elif self.graphs is not None:  # the same, replayed from a captured graph of its bucket
                logits = self.graphs.decode(self.s_token, self.s_pos, int(act[-1]) + 1)[act.to(dev)]
            else:  # the prefix of slots up to the highest in use, as views of the cache (GPU)
                hi = int(act[-1]) + 1
                logits = gen.model.decode(self.s_token[:hi].to(dev), self.s_pos[:hi].to(dev), self.cache, None,
                                          False)[act.to(dev)]
        rows, steps = self.s_row[act], self.s_step[act]
        tok, lp = self._sample(logits, self.u[rows, steps])
        ends = self._record(rows, steps, tok, lp)
        self.s_token[act], self.s_pos[act], self.s_step[act] = tok, self.s_pos[act] + 1, steps + 1
        for slot in act[ends].tolist():
            self.active.discard(slot)
            heapq.heappush(self.free, slot)
            self.s_token[slot], self.s_pos[slot] = 0, 0  # an idle slot in the GPU prefix writes at position 0
        self.counts["decode_steps"] += 1
        self.counts["slot_occupancy"] += len(act)
