"""Small CPU components for loops that end on a condition (`until:`): a token-by-token decoder whose rows
stop at their own EOS, a reward on the finished completions and a learner; an environment whose episodes
terminate early per row, a policy and its update.

Every per-row computation is keyed by the row's global index (`rows=`), never by its position in the
call's batch, so a row computes the same values whether the call has every row, only the rows not yet
done, or one split group's rows (docs/components.md, split invariance). Small and deterministic: the
tests compare the runtime on both backends against `reference_decode` / `reference_episodes`, the same
loops written out by hand.
"""

from __future__ import annotations

from typing import Any

import torch

from examples.bench.latency import wait_ms

__all__ = ["ToyLM", "LengthReward", "ToyEnv", "ToyPolicy", "ToyTool", "Tick", "RowFlags", "Gate", "SleepyLM", "SleepyJudge",
           "reference_decode", "reference_episodes", "reference_turns"]


def _noise(seed: int, it: Any, t: Any, rows: torch.Tensor, width: int) -> torch.Tensor:
    """Per-row pseudo-random numbers in [0, 1) from (seed, iteration, step, global row): the same row gets
    the same numbers in any batch it is computed in."""
    it, t = int(it), int(t)
    x = (rows.long().unsqueeze(1) * 1_000_003 + torch.arange(width).unsqueeze(0) * 7_919
         + (seed * 97 + it * 1_009 + t * 31) * 65_537)
    x = (x * 6_364_136_223_846_793_005 + 1_442_695_040_888_963_407) & 0x7FFF_FFFF
    return x.double() / float(0x8000_0000)


def _all(rows: Any, n: int) -> torch.Tensor:
    """The global rows a call computes: all, a split group's slice, or the indices of the rows not done."""
    if rows is None:
        return torch.arange(n)
    if isinstance(rows, slice):
        return torch.arange(rows.start, rows.stop)
    return torch.as_tensor(rows).long().reshape(-1)


class ToyLM:
    """A bigram 'language model': the next token of a row is the argmax of its current token's logits plus
    per-row Gumbel noise; token `eos` ends the row. `bias` makes EOS likelier at later steps, so rows end
    at spread-out lengths."""

    def __init__(self, vocab: int = 13, eos: int = 0, rows: int = 6, seed: int = 0, bias: float = 0.35) -> None:
        g = torch.Generator().manual_seed(seed)
        self.weights = torch.randn(vocab, vocab, generator=g, dtype=torch.float64) * 0.5
        self.vocab, self.eos, self.rows, self.seed, self.bias = vocab, eos, rows, seed, bias
        self._metrics: dict[str, float] = {}

    def prompts(self, it: int) -> dict[str, torch.Tensor]:
        u = _noise(self.seed, it, -1, torch.arange(self.rows), 1)[:, 0]
        return {"tok": 1 + (u * (self.vocab - 1)).long(), "len0": torch.zeros(self.rows, dtype=torch.long)}

    def step(self, tok: torch.Tensor, t: int, it: int, rows: Any = None) -> dict[str, torch.Tensor]:
        g = _all(rows, tok.shape[0])
        logits = self.weights[tok] + self.bias * t * (torch.arange(self.vocab) == self.eos)
        gumbel = -torch.log(-torch.log(_noise(self.seed, it, t, g, self.vocab).clamp(1e-12, 1 - 1e-12)))
        nxt = (logits + gumbel).argmax(dim=1)
        logp = torch.log_softmax(logits, dim=1).gather(1, nxt.unsqueeze(1)).squeeze(1)
        return {"tok": nxt, "logp": logp, "eos": nxt == self.eos, "len": torch.full_like(nxt, t + 1)}

    def update(self, logp: torch.Tensor, reward: torch.Tensor, eos: torch.Tensor) -> None:
        live = _live_mask(eos)
        loss = -(logp * live * reward.unsqueeze(0)).sum() / live.sum()
        self.weights = self.weights - 0.01 * float(loss) * torch.ones_like(self.weights)
        self._metrics = {"loss": float(loss), "tokens": float(live.sum())}

    def learn(self, reward: torch.Tensor) -> None:
        """A step on the rewards of the finished completions alone (what a split's groups hand on)."""
        self.weights = self.weights + 0.01 * float(reward.mean()) * torch.ones_like(self.weights)
        self._metrics = {"reward": float(reward.mean()), "checksum": float(self.weights.sum())}

    def pop_metrics(self) -> dict[str, float]:
        out, self._metrics = self._metrics, {}
        return out


def _live_mask(done: torch.Tensor) -> torch.Tensor:
    """[T, N] done flags (held after a row is done) -> 1.0 where the row was computed: up to and including
    the step that made it done."""
    done = done.double()
    before = torch.cat([torch.zeros_like(done[:1]), done[:-1]])
    return 1.0 - before


class LengthReward:
    """A verifiable-style reward on CPU: a completion scores higher the closer its length is to `target`
    (the length is read from the done flags, as a reward model reads the tokens up to EOS)."""

    def __init__(self, target: int = 5) -> None:
        self.target = target
        self._metrics: dict[str, float] = {}

    def score(self, tokens: torch.Tensor, eos: torch.Tensor) -> dict[str, torch.Tensor]:
        length = _live_mask(eos).sum(dim=0)
        reward = -(length - self.target).abs() + 0.01 * tokens[-1].double()
        self._metrics = {"reward": float(reward.mean()), "length": float(length.mean())}
        return {"reward": reward}

    def final(self, tok: torch.Tensor, length: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per row, from each completion's last token and length (separable: a row group scores its rows)."""
        return {"reward": -(length.double() - self.target).abs() + 0.01 * tok.double()}

    def pop_metrics(self) -> dict[str, float]:
        out, self._metrics = self._metrics, {}
        return out


class ToyEnv:
    """A vectorised environment whose episodes terminate per row: a row is done when its position leaves
    [-limit, limit]. State `episode` holds every row's position (written only at the rows it is given).
    `fixed_ms`/`per_row_ms`: the latency of a step (default none)."""

    def __init__(self, num_envs: int = 6, limit: float = 1.0, seed: int = 0, fixed_ms: float = 0.0,
                 per_row_ms: float = 0.0) -> None:
        self.num_envs, self.limit, self.seed = num_envs, limit, seed
        self.fixed_ms, self.per_row_ms = float(fixed_ms), float(per_row_ms)
        self.episode = torch.zeros(num_envs, dtype=torch.float64)
        self._metrics: dict[str, float] = {}

    def reset(self, it: int) -> dict[str, torch.Tensor]:
        self.episode = (_noise(self.seed, it, -2, torch.arange(self.num_envs), 1)[:, 0] - 0.5) * self.limit
        return {"obs": self.episode.clone().unsqueeze(1)}

    def step(self, action: torch.Tensor, rows: Any = None) -> dict[str, torch.Tensor]:
        g = _all(rows, action.shape[0])
        wait_ms(self.fixed_ms, self.per_row_ms, len(g))
        pos = self.episode[g] + action[:, 0]
        self.episode[g] = pos
        done = pos.abs() > self.limit
        return {"obs": pos.unsqueeze(1), "reward": 1.0 - pos.abs(), "done": done}

    def pop_metrics(self) -> dict[str, float]:
        out, self._metrics = self._metrics, {}
        return out


class ToyPolicy:
    """A linear policy with per-row noise; `update` takes a step on the returns of the steps before each
    row's termination. `fixed_ms`/`per_row_ms`: the latency of an act, `update_ms` of an update (default none)."""

    def __init__(self, seed: int = 0, fixed_ms: float = 0.0, per_row_ms: float = 0.0, update_ms: float = 0.0) -> None:
        self.seed = seed
        self.fixed_ms, self.per_row_ms, self.update_ms = float(fixed_ms), float(per_row_ms), float(update_ms)
        self.weights = torch.tensor([0.3, 0.2], dtype=torch.float64)
        self._metrics: dict[str, float] = {}

    def act(self, obs: torch.Tensor, t: int, it: int, rows: Any = None) -> dict[str, torch.Tensor]:
        g = _all(rows, obs.shape[0])
        wait_ms(self.fixed_ms, self.per_row_ms, len(g))
        noise = _noise(self.seed, it, t, g, 1) - 0.5
        return {"action": self.weights[0] * obs + self.weights[1] + noise * 0.4}

    def update(self, rewards: torch.Tensor, done: torch.Tensor) -> None:
        wait_ms(self.update_ms, 0.0, 0)
        live = _live_mask(done)
        ret = (rewards * live).sum(dim=0)
        self.weights = self.weights + 0.01 * torch.stack([ret.mean(), (live.sum(dim=0) / live.shape[0]).mean()])
        self._metrics = {"return": float(ret.mean()), "episode_len": float(live.sum(dim=0).mean()),
                         "env_steps": float(live.sum())}

    def pop_metrics(self) -> dict[str, float]:
        out, self._metrics = self._metrics, {}
        return out


def _held_loop(count: int, n: int, trip) -> tuple[list[dict[str, torch.Tensor]], int]:
    """The per-row `until` loop written out by hand: trip t computes only the rows not done (`trip(t,
    rows)` returns their outputs and done flags), a done row keeps its last values, and the loop has `count`
    iterations seen from outside (those after every row is done repeat the last one). Returns every
    iteration's full outputs and the trips that ran."""
    done = torch.zeros(n, dtype=torch.bool)
    outs: list[dict[str, torch.Tensor]] = []
    trips = 0
    for t in range(count):
        if bool(done.all()):
            outs.append(outs[-1])
            continue
        rows = torch.arange(n) if t == 0 else done.logical_not().nonzero().flatten()
        new, flags = trip(t, rows)
        full = {k: v.clone() for k, v in outs[-1].items()} if outs else {k: v.clone() for k, v in new.items()}
        for k, v in new.items():
            full[k][rows] = v
        outs.append(full)
        done = done.clone()
        done[rows] |= flags
        trips += 1
    return outs, trips


def reference_decode(iterations: int, rows: int, max_new: int, seed: int = 0, target: int = 5) -> list[dict[str, float]]:
    """`workflows`-free reference of tests' decode workflow (`tests/interpreter/test_until_runtime.py`):
    the metrics each iteration logs."""
    lm, rm = ToyLM(rows=rows, seed=seed), LengthReward(target)
    out = []
    for it in range(iterations):
        tok = lm.prompts(it)["tok"]
        state = {"tok": tok}

        def trip(t: int, idx: torch.Tensor, it: int = it, state: dict = state) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
            r = lm.step(state["tok"][idx], t, it, rows=idx)
            full = state["tok"].clone()
            full[idx] = r["tok"]
            state["tok"] = full
            return r, r["eos"]

        steps, _ = _held_loop(max_new, rows, trip)
        tokens = torch.stack([s["tok"] for s in steps])
        eos = torch.stack([s["eos"] for s in steps])
        logp = torch.stack([s["logp"] for s in steps])
        reward = rm.score(tokens, eos)["reward"]
        lm.update(logp, reward, eos)
        out.append({**{f"judge/{k}": v for k, v in rm.pop_metrics().items()},
                    **{f"lm/{k}": v for k, v in lm.pop_metrics().items()}})
    return out


def reference_episodes(iterations: int, num_envs: int, max_steps: int, seed: int = 0) -> list[dict[str, float]]:
    """Reference of the tests' episode workflow: per-row termination, written out by hand."""
    env, pi = ToyEnv(num_envs, seed=seed), ToyPolicy(seed)
    out = []
    for it in range(iterations):
        state = {"obs": env.reset(it)["obs"]}

        def trip(t: int, idx: torch.Tensor, it: int = it, state: dict = state) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
            a = pi.act(state["obs"][idx], t, it, rows=idx)["action"]
            r = env.step(a, rows=idx)
            full = state["obs"].clone()
            full[idx] = r["obs"]
            state["obs"] = full
            return {"action": a, **r}, r["done"]

        steps, _ = _held_loop(max_steps, num_envs, trip)
        pi.update(torch.stack([s["reward"] for s in steps]), torch.stack([s["done"] for s in steps]))
        out.append({f"pi/{k}": v for k, v in pi.pop_metrics().items()})
    return out


class ToyTool:
    """A tool an agent calls after each turn's decode (tests of a per-row turn loop around a per-row decode
    loop): it maps a row's last token to the next turn's first token, adds the turn's length to the row's
    total, and ends the row (`done`) on a per-row draw of probability `p_done` -- or when the tool call
    'times out', which here is a turn longer than `timeout_len` tokens: the row ends then too."""

    def __init__(self, vocab: int = 13, seed: int = 0, p_done: float = 0.35, timeout_len: int = 99) -> None:
        self.vocab, self.seed, self.p_done, self.timeout_len = vocab, seed, p_done, timeout_len

    def run(self, tok: torch.Tensor, total: torch.Tensor, length: torch.Tensor, turn: int, it: int,
            rows: Any = None) -> dict[str, torch.Tensor]:
        g = _all(rows, tok.shape[0])
        u = _noise(self.seed, it, 1000 + int(turn), g, 1)[:, 0]
        out = (tok * 3 + g + int(turn)) % (self.vocab - 1) + 1
        done = (u < self.p_done) | (length > self.timeout_len)
        return {"tok": out, "total": total + length, "done": done}


def reference_turns(iterations: int, rows: int, turns: int, max_new: int, seed: int = 3,
                    timeout_len: int = 99) -> list[dict[str, float]]:
    """Reference of the tests' turn workflow (`tests/dsl/fixtures/until_turns.yaml`), one row at a time: up
    to `turns` turns, each a decode of up to `max_new` tokens that stops at the row's EOS, then a tool call
    that may end the row; a reward on the last token and total length; a learner step."""
    lm, tool, rm = ToyLM(rows=rows, seed=seed), ToyTool(seed=seed, timeout_len=timeout_len), LengthReward()
    out = []
    for it in range(iterations):
        first = lm.prompts(it)["tok"]
        toks, totals = [], []
        for r in range(rows):
            g = torch.tensor([r])
            tok, total = first[g], torch.zeros(1, dtype=torch.long)
            for t in range(turns):
                for j in range(max_new):
                    step = lm.step(tok, j, it * 10 + t, rows=g)
                    tok = step["tok"]
                    if bool(step["eos"].all()):
                        break
                call = tool.run(tok, total, step["len"], t, it, rows=g)
                tok, total = call["tok"], call["total"]
                if bool(call["done"].all()):
                    break
            toks.append(tok)
            totals.append(total)
        reward = rm.final(torch.cat(toks), torch.cat(totals))["reward"]
        lm.learn(reward)
        out.append({f"lm/{k}": v for k, v in lm.pop_metrics().items()})
    return out


class RowFlags:
    """Per-row done flags and one flag for all rows (`all`), for tests of what a condition may be: a loop that
    ends per row must be given the per-row `done`."""

    def flags(self, eos: torch.Tensor, rows: Any = None) -> dict[str, torch.Tensor]:
        return {"done": eos.clone(), "all": eos.bool().all()}


class Gate:
    """One flag for all rows, for a loop that ends as a whole (rounds of rollouts and updates): done after `k`
    checks, or once the sum of `x` (the last round's rewards) passes `threshold`."""

    def __init__(self, k: int = 2, threshold: float = float("inf")) -> None:
        self.k, self.threshold = int(k), float(threshold)
        self._metrics: dict[str, float] = {}

    def check(self, x: torch.Tensor, t: int) -> dict[str, torch.Tensor]:
        total = float(x.double().sum())
        self._metrics = {"sum": total, "rounds": float(int(t) + 1)}
        return {"done": torch.tensor(int(t) + 1 >= self.k or total > self.threshold)}

    def pop_metrics(self) -> dict[str, float]:
        out, self._metrics = self._metrics, {}
        return out


class Tick:
    """A counter per row for dispatch benchmarks: `start` gives each row its number of trips, `tick` counts
    one down and says which rows reached zero (`benchmarks/until_dispatch.py`)."""

    def __init__(self, rows: int = 8, trips: int = 100, spread: bool = False) -> None:
        self.rows, self.trips, self.spread = rows, trips, spread

    def start(self, it: int) -> dict[str, torch.Tensor]:
        left = torch.full((self.rows,), self.trips, dtype=torch.long)
        if self.spread:  # rows end at evenly spread trips, the last at `trips`
            left = torch.linspace(1, self.trips, self.rows).round().long()
        return {"x": left}

    def tick(self, x: torch.Tensor, rows: Any = None) -> dict[str, torch.Tensor]:
        y = x - 1
        return {"x": y, "done": y <= 0}


def _lengths(seed: int, it: int, rows: torch.Tensor, mean: float, sigma: float, most: int) -> torch.Tensor:
    """Per-row completion lengths with a long tail: lognormal with the given mean (in trips) and log-sd,
    from each row's own noise (the same whatever batch computes it), at least 1, at most `most`."""
    u = _noise(seed, it, -3, rows, 2).clamp(1e-9, 1 - 1e-9)
    z = torch.sqrt(-2 * torch.log(u[:, 0])) * torch.cos(2 * torch.pi * u[:, 1])  # Box-Muller
    mu = torch.log(torch.tensor(mean)) - sigma * sigma / 2
    return torch.exp(mu + sigma * z).round().clamp(1, most).long()


class SleepyLM:
    """A decoder whose step costs `fixed_ms + per_row_ms * rows` of wall time (sleep: no CPU, so a benchmark
    on a loaded machine measures scheduling, not contention) and whose rows end at long-tailed lengths
    (`_lengths`): the shape of LLM generation with a long tail, for `benchmarks/until_long_tail.py`."""

    def __init__(self, rows: int = 16, fixed_ms: float = 1.0, per_row_ms: float = 0.1, mean: float = 8.0,
                 sigma: float = 1.0, most: int = 64, seed: int = 0) -> None:
        self.rows, self.fixed, self.per_row = rows, fixed_ms / 1e3, per_row_ms / 1e3
        self.mean, self.sigma, self.most, self.seed = mean, sigma, most, seed
        self.weights = torch.zeros(1, dtype=torch.float64)
        self.tokens = 0

    def prompts(self, it: int) -> dict[str, torch.Tensor]:
        return {"tok": torch.zeros(self.rows, dtype=torch.long), "len0": torch.zeros(self.rows, dtype=torch.long)}

    def step(self, tok: torch.Tensor, t: int, it: int, rows: Any = None) -> dict[str, torch.Tensor]:
        import time

        g = _all(rows, tok.shape[0])
        time.sleep(self.fixed + self.per_row * len(g))
        self.tokens += len(g)
        ends = _lengths(self.seed, it, g, self.mean, self.sigma, self.most)
        return {"tok": tok + 1, "eos": ends <= t + 1, "len": torch.full_like(tok, t + 1)}

    def learn(self, reward: torch.Tensor) -> None:
        self.weights = self.weights + 1e-3 * float(reward.mean())

    def pop_metrics(self) -> dict[str, float]:
        out, self.tokens = {"tokens": float(self.tokens), "weights": float(self.weights.sum())}, 0
        return out


class SleepyJudge:
    """Scores finished completions: `per_token_ms` of wall time per token scored (a reward model's pass)."""

    def __init__(self, per_token_ms: float = 0.05) -> None:
        self.per_token = per_token_ms / 1e3

    def final(self, tok: torch.Tensor, length: torch.Tensor) -> dict[str, torch.Tensor]:
        import time

        time.sleep(self.per_token * float(length.sum()))
        return {"reward": -length.double()}
