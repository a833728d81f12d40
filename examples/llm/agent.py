"""Agent: the long-tail decoder as a multi-turn, tool-using policy (`workflows/llm_agent_tools*.yaml`).

Per sample, turns alternate decoding and tool calls: a turn decodes until EOS (the sample's answer is
done), the tool-call token (`tools.CALL`, `=`: the text since the last tool output is the call), or the
turn's token budget (then the agent ends the call itself: `=` is appended as a tool token); the tool's
output (`tools.ToolPool`) is appended to the sample's context at the next turn -- fed through the decoder
one token at a time, **extending the KV cache, never recomputing it** -- and decoding goes on, for at most
`max_turns` turns. The workflow's per-row turn loop calls `turn` on the prompt rows still active (a
prompt row is done when its K samples are) and the tool on what `turn` returned; `finish` returns the
rollouts in the record every other component reads (`generator.py`: prompts on dim 0, `tokens` [P, K, L]
holding the policy's and the tools' tokens, `mask` only the policy's, so tool tokens are scored by the
reference and learner as context and never trained on; `logp` the behaviour log-probs).

What it reuses: `Generator` (weights, state, hash-checked weight sync, policy versions, bf16 on CUDA),
the decoder and its slot KV cache (one slot per sample from `start` to `finish`: a sample waiting on its
tool keeps its KV), the per-(prompt, sample) uniform streams and the sampler. Turn budgets: `turn_tokens`,
or drawn per (sample, turn) from the lognormal of `turn_len_mean`/`turn_len_p99` (a systems stand-in,
like the long-tail workload's forced lengths; the policy's own EOS and `=` still end a turn earlier, so
the sampling distribution is the unmasked one the learner recomputes).

Forced turns (`forced_turns`, off by default; a systems stand-in for a trained agent's shape, as the
long-tail workload's `length_mean`/`length_p99` are for its lengths): an untrained policy over the small
vocabulary draws EOS after a few tokens, so its turns are short and mostly one. With `forced_turns`, EOS
and `=` are banned wherever the policy samples, every turn runs to its budget and the budget ends it as
a call (`=` appended as a tool token), and each sample's number of turns is drawn: prompt p draws a cap
C_p uniform in 1..`max_turns` keyed by (seed, it, prompt id), its sample j a count uniform in 1..C_p
keyed by (seed, it, prompt id, j) -- so prompt rows end their turn loops at different trips and samples
of a row at different turns. The last drawn turn's budget ends the sample, EOS unsampled, as finished.
The rollouts carry `no_eos` and `no_call` [P], and the reference and learner recompute log-probs under
the same bans (`policy.completion_logp`), so the behaviour log-probs are theirs.

Reproducibility: on the CPU each sample's tokens depend only on its own prompt, stream and tool outputs
(row-invariant decode), so every row grouping and turn interleaving gives the same tokens (tested).
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from typing import Any

import torch

from examples.llm.generator import Generator, Record
from examples.llm.sampling import allowed_logits, forced_lengths, sample_rows, uniform_streams
from examples.llm.seeding import mix_seed
from examples.llm.tools import CALL

__all__ = ["Agent", "forced_turns"]

_TURN_STREAM = 0x7A5  # the forced turn counts' own stream, apart from the uniforms and the length draws


def forced_turns(seed: int, it: int, prompt_ids: list[int], k: int, max_turns: int) -> torch.Tensor:
    """Each sample's number of turns [P, K] (int64, in [1, max_turns]): prompt p draws a cap uniform in
    1..max_turns keyed by (seed, it, prompt id), its sample j a count uniform in 1..cap keyed by (seed, it,
    prompt id, j); so every plan and row grouping draws the same counts, and prompt rows end their turn
    loops at different trips (a row ends with its longest sample, which the cap bounds)."""
    out = torch.empty(len(prompt_ids), k, dtype=torch.long)
    for p, pid in enumerate(prompt_ids):
        cap = random.Random(mix_seed(seed, it, pid, _TURN_STREAM)).randint(1, max_turns)
        for j in range(k):
            out[p, j] = random.Random(mix_seed(seed, it, pid, j, _TURN_STREAM)).randint(1, cap)
    return out


class Agent(Generator):
    """The policy of the agent workload. State `weights` (as `Generator`)."""

    def __init__(self, k: int, max_turns: int, turn_tokens: int, obs_tokens: int = 6, turn_len_mean: float = 0.0,
                 turn_len_p99: float = 0.0, forced_turns: bool = False, temperature: float = 1.0, seed: int = 0,
                 device: str = "cpu",
                 max_batch: int = 256, policy: Mapping[str, Any] | None = None, cache_dir: str | None = None,
                 tokenizer_hash: str | None = None, prompt_tokens: int = 7) -> None:
        from examples.llm.policy import PolicySpec

        spec = PolicySpec.from_args(policy)
        length = spec.context - int(prompt_tokens)
        super().__init__(k, length, temperature=temperature, seed=seed, device=device, max_batch=max_batch,
                         policy=policy, cache_dir=cache_dir, tokenizer_hash=tokenizer_hash, cuda_graphs=False)
        if int(max_turns) < 1 or int(turn_tokens) < 1:
            raise ValueError(f"Agent: max_turns and turn_tokens must be >= 1, got {max_turns}, {turn_tokens}")
        if not isinstance(forced_turns, bool):
            raise ValueError(f"Agent: forced_turns must be true or false, got {forced_turns!r}")
        if bool(turn_len_mean) != bool(turn_len_p99):
            raise ValueError("Agent: give both turn_len_mean and turn_len_p99 (drawn turn budgets) or neither")
        self.max_turns, self.turn_tokens, self.obs_tokens = int(max_turns), int(turn_tokens), int(obs_tokens)
        self.turn_lengths = (float(turn_len_mean), float(turn_len_p99)) if turn_len_mean else None
        self.call_id = self.tokenizer.encode(CALL)[0]
        self.forced = bool(forced_turns)
        self.ban = [self.tokenizer.eos_id, self.call_id] if self.forced else None
        self._flight = _Samples(self)  # type: ignore[assignment]

    # -- the workflow's calls ----------------------------------------------------------------------------
    def start(self, prompts: Record, it: int, rows: slice | None = None) -> dict[str, torch.Tensor]:
        """Give each prompt's K samples a decode slot and run its prefill (shared by its samples). Returns the
        turn loop's first carried values: no tool output yet, no sample done."""
        ids = self._prompt_ids(prompts, rows)
        self._flight.add(prompts, int(it), ids)
        p, k = len(ids), self.k
        return {"obs": torch.full((p, k, self.obs_tokens), self.tokenizer.pad_id, dtype=torch.long),
                "obs_len": torch.zeros(p, k, dtype=torch.long), "sdone": torch.zeros(p, k, dtype=torch.bool)}

    def turn(self, obs: torch.Tensor, obs_len: torch.Tensor, sdone: torch.Tensor, turn: int, it: int,
             rows: Any = None) -> dict[str, Record]:
        """One turn of the given prompt rows' samples not done: their tool outputs appended (the KV cache
        extended), then decoded until EOS, the tool-call token or the turn's budget. Returns `{"call": record}`:
        text [P, K, S] (the turn's policy tokens), text_len, called (ended on a call), ended (EOS, out of
        context, or a call in the last turn), index [P]."""
        t0 = time.perf_counter()
        keys = self._flight.keys(rows, obs.shape[0], int(it))
        out = self._flight.turn(keys, obs, obs_len, sdone, int(turn))
        self._metrics["seconds"] = self._metrics.get("seconds", 0.0) + time.perf_counter() - t0
        return {"call": out}

    def finish(self, sdone: torch.Tensor, prompts: Record, it: int, rows: Any = None) -> dict[str, Record]:
        """The rollouts of the given prompt rows (their samples released): the generator's record."""
        keys = self._flight.keys(rows, sdone.shape[0], int(it))
        out = self._flight.take(keys)
        p = len(keys)
        out.update(prompt=prompts["tokens"].clone(), prompt_len=prompts["lengths"].long().clone(),
                   temperature=torch.full((p,), self.temperature, dtype=torch.float32),
                   index=torch.tensor([pid for _, pid in keys], dtype=torch.long),
                   version=torch.full((p, self.k), self.version, dtype=torch.long),
                   no_eos=torch.full((p,), self.forced, dtype=torch.bool),
                   no_call=torch.full((p,), self.forced, dtype=torch.bool))
        if "answer" in prompts:
            out["answer"] = prompts["answer"].clone()
        m = self._metrics
        m["sequences"] = m.get("sequences", 0.0) + float(p * self.k)
        m["eos"] = m.get("eos", 0.0) + float(out["finished"].sum())
        return {"rollouts": out}

    def pop_metrics(self) -> dict[str, float]:
        m, self._metrics = self._metrics, {}
        c = self._flight.pop_counts()
        if not m and not any(c.values()):
            return {}
        tokens = c["tokens"]
        return {"tokens": tokens, "generated_tokens": tokens, "tokens_per_s": tokens / max(m.get("seconds", 0.0), 1e-9),
                "tool_tokens": c["tool_tokens"], "calls": c["calls"], "prefills": c["prefills"],
                "decode_steps": c["decode_steps"], "mean_turns": c["turns"] / max(m.get("sequences", 0.0), 1.0),
                "eos_rate": m.get("eos", 0.0) / max(m.get("sequences", 0.0), 1.0), "weights_version": float(self.version)}


class _Samples:
    """Every sample between `start` and `finish`: its completion so far (policy and tool tokens), its
    behaviour log-probs, how much of it the KV cache holds, and its slot."""

    def __init__(self, agent: Agent) -> None:
        self.a = agent
        self.cache: Any = None
        self.free = list(range(agent.max_batch))
        self.first: dict[tuple[int, int], int] = {}  # (it, prompt id) -> its first sample (K each)
        self.order: dict[int, list[int]] = {}  # it -> prompt ids in `start`'s row order
        self.data: dict[int, dict[str, Any]] = {}  # sample -> its arrays
        self.next = 0
        self.counts = dict.fromkeys(("tokens", "tool_tokens", "calls", "prefills", "decode_steps", "turns"), 0.0)

    def rows_in_flight(self) -> bool:
        return bool(self.first)

    def discard(self) -> None:
        self.__init__(self.a)  # type: ignore[misc]

    def pop_counts(self) -> dict[str, float]:
        out, self.counts = self.counts, dict.fromkeys(self.counts, 0.0)
        return out

    def keys(self, rows: Any, n: int, it: int) -> list[tuple[int, int]]:
        """The prompt keys of a call's rows: its rows of `start`'s batch (a split group's, or those not done)."""
        order = self.order[it]
        if rows is None:
            idx = list(range(n))
        elif isinstance(rows, slice):
            idx = list(range(rows.start or 0, (rows.start or 0) + n))
        else:
            idx = [int(r) for r in torch.as_tensor(rows).reshape(-1).tolist()]
        return [(it, order[r]) for r in idx]

    def add(self, prompts: Record, it: int, ids: list[int]) -> None:
        a, k, length = self.a, self.a.k, self.a.max_new_tokens
        if len(self.free) < len(ids) * k:
            raise RuntimeError(f"Agent: {len(ids) * k} samples need decode slots, {len(self.free)} are free "
                               "(raise max_batch: a sample keeps its slot while it waits on its tool)")
        self.order.setdefault(it, [])
        u = uniform_streams(a.seed, it, ids, k, length)
        budgets = self._budgets(it, ids)
        turns = (forced_turns(a.seed, it, ids, k, a.max_turns) if a.forced
                 else torch.full((len(ids), k), a.max_turns, dtype=torch.long))
        plen = prompts["lengths"].long()
        for r, pid in enumerate(ids):
            self.order[it].append(pid)
            self.first[(it, pid)] = self.next
            tokens = prompts["tokens"][r, : int(plen[r])]
            with a._autocast():
                logits, kv_k, kv_v = a.model.prefill(tokens.to(a.device))
            self.counts["prefills"] += 1
            slots = torch.tensor([self.free.pop(0) for _ in range(k)], dtype=torch.long)
            if self.cache is None:
                self.cache = a.model.new_cache(a.max_batch, a.device, kv_k.dtype)
            self.cache.load_prefix(slots.to(a.device), kv_k, kv_v)  # the prompt's KV, expanded to its samples
            for j in range(k):
                self.data[self.next + j] = {
                    "slot": int(slots[j]), "plen": int(plen[r]), "u": u[r, j], "budget": budgets[r, j],
                    "tok": torch.full((length,), a.tokenizer.pad_id, dtype=torch.long), "logp": torch.zeros(length),
                    "mask": torch.zeros(length, dtype=torch.bool), "len": 0, "fed": 0, "ended": False, "eos": False,
                    "logits": logits.float(), "turns": 0,
                    "last": int(turns[r, j]) - 1}
            self.next += k

    def _budgets(self, it: int, ids: list[int]) -> torch.Tensor:
        """Each (prompt, sample, turn)'s token budget [P, K, T]: `turn_tokens`, or drawn (capped at it)."""
        a = self.a
        if a.turn_lengths is None:
            return torch.full((len(ids), a.k, a.max_turns), a.turn_tokens, dtype=torch.long)
        return torch.stack([forced_lengths(a.seed * 1_000 + t + 1, it, ids, a.k, *a.turn_lengths, a.turn_tokens)
                            for t in range(a.max_turns)], dim=-1)

    def _samples(self, keys: list[tuple[int, int]]) -> list[list[int]]:
        return [list(range(self.first[key], self.first[key] + self.a.k)) for key in keys]

    def turn(self, keys: list[tuple[int, int]], obs: torch.Tensor, obs_len: torch.Tensor, sdone: torch.Tensor,
             turn: int) -> Record:
        a, length = self.a, self.a.max_new_tokens
        groups = self._samples(keys)
        p, k, s_max = len(keys), a.k, a.turn_tokens
        live = []
        for r, group in enumerate(groups):
            for j, s in enumerate(group):
                d = self.data[s]
                if bool(sdone[r, j]) or d["ended"]:
                    continue
                if turn > 0:  # the tool's output becomes context (a call the budget ended gets its `=` first)
                    extra = ([] if d["called_by_policy"] else [a.call_id]) + obs[r, j, : int(obs_len[r, j])].tolist()
                    if d["len"] + len(extra) + 1 > length:
                        d["ended"] = True  # no room left in the context
                        continue
                    d["tok"][d["len"]: d["len"] + len(extra)] = torch.tensor(extra, dtype=torch.long)
                    d["len"] += len(extra)
                    self.counts["tool_tokens"] += len(extra)
                live.append(s)
        self._feed(live)
        start = {s: self.data[s]["len"] for s in live}
        self._decode(live, turn)
        out = {"text": torch.full((p, k, s_max + 1), a.tokenizer.pad_id, dtype=torch.long),
               "text_len": torch.zeros(p, k, dtype=torch.long), "called": torch.zeros(p, k, dtype=torch.bool),
               "ended": torch.zeros(p, k, dtype=torch.bool),
               "index": torch.tensor([pid for _, pid in keys], dtype=torch.long)}
        for r, group in enumerate(groups):
            for j, s in enumerate(group):
                d = self.data[s]
                out["ended"][r, j] = d["ended"]
                if s in start:
                    seg = d["tok"][start[s]: d["len"]]
                    out["text"][r, j, : len(seg)] = seg
                    out["text_len"][r, j] = len(seg)
                    out["called"][r, j] = not d["ended"]
                    self.counts["calls"] += float(not d["ended"])
                    d["turns"] += 1
        return out

    def _feed(self, samples: list[int]) -> None:
        """Decode each sample's tokens the KV cache does not hold yet (its last turn's last token, the tool's
        output), one position per step: the cache extended, nothing recomputed; leaves each sample's logits
        for its next token."""
        while todo := [s for s in samples if self.data[s]["fed"] < self.data[s]["len"]]:
            tok = torch.tensor([int(self.data[s]["tok"][self.data[s]["fed"]]) for s in todo], dtype=torch.long)
            pos = torch.tensor([self.data[s]["plen"] + self.data[s]["fed"] for s in todo], dtype=torch.long)
            logits = self._step(todo, tok, pos)
            for n, s in enumerate(todo):
                self.data[s]["fed"] += 1
                self.data[s]["logits"] = logits[n]

    def _step(self, samples: list[int], tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        a = self.a
        slots = torch.tensor([self.data[s]["slot"] for s in samples], dtype=torch.long).to(a.device)
        with a._autocast():
            logits = a.model.decode(tok.to(a.device), pos.to(a.device), self.cache, slots, a.row_invariant)
        self.counts["decode_steps"] += 1
        return logits.float()

    def _decode(self, samples: list[int], turn: int) -> None:
        """Sample the live samples' tokens until each ends its turn (continuous batching over them)."""
        a, length = self.a, self.a.max_new_tokens
        begin = {s: self.data[s]["len"] for s in samples}
        active = list(samples)
        while active:
            logits = torch.stack([self.data[s]["logits"] for s in active])
            u = torch.stack([self.data[s]["u"][self.data[s]["len"]] for s in active])
            tok, lp = sample_rows(allowed_logits(logits, a.tokenizer.vocab_size, a.ban), u, a.temperature, a.top_p)
            tok, lp = tok.cpu(), lp.cpu()  # one copy per step (the bookkeeping below reads them per sample)
            going, feed = [], []
            for n, s in enumerate(active):
                d, t = self.data[s], int(tok[n])
                d["tok"][d["len"]], d["logp"][d["len"]], d["mask"][d["len"]] = t, float(lp[n]), True
                d["len"] += 1
                self.counts["tokens"] += 1
                d["called_by_policy"] = t == a.call_id
                budget = d["len"] - begin[s] >= int(d["budget"][turn])
                last = turn >= d["last"]  # the sample's last turn (`max_turns`, or its forced count)
                if t == a.tokenizer.eos_id or (a.forced and budget and last):
                    d["ended"] = d["eos"] = True  # forced: the last turn's budget ends it, EOS unsampled
                elif d["len"] + 2 >= length or ((t == a.call_id or budget) and last):
                    d["ended"] = True  # out of context, or a call with no turn left to read its answer
                elif not (t == a.call_id or budget):
                    going.append(s)
                    feed.append(t)
            if going:
                pos = torch.tensor([self.data[s]["plen"] + self.data[s]["len"] - 1 for s in going], dtype=torch.long)
                logits_next = self._step(going, torch.tensor(feed, dtype=torch.long), pos)
                for n, s in enumerate(going):
                    self.data[s]["fed"] = self.data[s]["len"]
                    self.data[s]["logits"] = logits_next[n]
            active = going

    def take(self, keys: list[tuple[int, int]]) -> Record:
        a, length = self.a, self.a.max_new_tokens
        groups = self._samples(keys)
        p, k = len(keys), a.k
        out = {"tokens": torch.full((p, k, length), a.tokenizer.pad_id, dtype=torch.long),
               "logp": torch.zeros(p, k, length), "mask": torch.zeros(p, k, length, dtype=torch.bool),
               "lengths": torch.zeros(p, k, dtype=torch.long), "finished": torch.zeros(p, k, dtype=torch.bool)}
        for r, group in enumerate(groups):
            for j, s in enumerate(group):
                d = self.data.pop(s)
                n = d["len"]
                out["tokens"][r, j, :n], out["logp"][r, j, :n] = d["tok"][:n], d["logp"][:n] * d["mask"][:n]
                out["mask"][r, j, :n], out["lengths"][r, j], out["finished"][r, j] = d["mask"][:n], n, d["eos"]
                self.counts["turns"] += d["turns"]
                self.free.append(d["slot"])
            del self.first[keys[r]]
        self.free.sort()
        for it in {key[0] for key in keys}:
            if not any(key[0] == it for key in self.first):
                self.order.pop(it, None)
        return out
