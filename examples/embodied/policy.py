"""The rollout policy component: a flow-matching VLA-shaped policy (see `model.py`).

`act` is exposed both whole and as its phases (`backbone` -> `flow_step` x K -> `head`) so rose can
schedule the low-utilisation denoising loop separately; `act` is literally that composition, so the
two paths are bit-identical.

Split invariance (see `determinism.py`): the initial flow noise x0 and the exploration noise of row
r at (it, ep, t) are row r of a draw over all `num_envs` rows from generators seeded by
(seed, stream, it, ep, t), and on the CPU the network runs on fixed blocks of `row_block` rows
aligned to global row indices, so calls over any row partition give bit-identical results. That is
why `flow_step` takes `rows` too.

Exact PPO ratios: the final action is `mean + std * eps` with `mean = flow(obs, x0)`. Given x0 the
action is Gaussian, so `act` also returns **x0**; the trainer recomputes the flow from the stored x0
under its current weights (`FlowNet.evaluate`) and gets the exact log-probability. (x0 is
exogenous noise, independent of everything else, so treating it as part of the observation is a
valid policy-gradient estimator.)
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from .data_parallel import ReplicaRows
from .determinism import blocked_apply, keyed_normal, resolve_rows
from .model import FlowNet, FlowNetConfig, Obs, build_model

Record = dict[str, torch.Tensor]


def autocast_for(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on CUDA; plain fp32 elsewhere (CPU bf16 is slow and changes numerics)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def obs_rows(obs: Obs) -> int:
    return (obs["state"] if isinstance(obs, dict) else obs).shape[0]


def obs_to(obs: Obs, device: torch.device) -> Obs:
    if isinstance(obs, dict):
        return {k: v.to(device) for k, v in obs.items()}
    return obs.to(device)


class DenoiseGraphs:
    """The denoising steps of a `FlowNet` as captured CUDA graphs, one set per batch size.

    Why: a denoising step runs the action expert over `chunk` tokens -- a few dozen small kernels whose
    launches, not their arithmetic, set its time (measured: 4 ms per step on the H200 at 256 envs,
    at 7% SM activity). A strong user captures them once and replays. Two kinds of graph per batch
    size `n`: one per step `k` (for the phased path, `FlowPolicy.flow_step`) and one of the whole loop
    (for `act`). Inputs are copied into static buffers, outputs cloned out of them.

    Correctness: a replay computes what the eager step computes (same kernels, bf16 autocast without
    its weight cache); weights are refreshed in place (`load_state_dict` copies into the captured
    parameters), so the graphs stay valid across weight syncs.
    """

    def __init__(self, model: FlowNet) -> None:
        self.model = model
        self.pool = torch.cuda.graph_pool_handle()
        self._sets: dict[tuple[int, tuple[int, ...]], dict[str, Any]] = {}

    def _set(self, x: torch.Tensor, prefix: torch.Tensor) -> dict[str, Any]:
        key = (x.shape[0], tuple(prefix.shape[1:]))
        found = self._sets.get(key)
        if found is None:
            found = self._sets[key] = self._capture(x, prefix)
        return found

    def _capture(self, x: torch.Tensor, prefix: torch.Tensor) -> dict[str, Any]:
        model, steps = self.model, self.model.cfg.denoise_steps
        static_x, static_prefix = x.detach().clone(), prefix.detach().clone()

        def one(k: int, inp: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                return model.flow_step(inp, static_prefix, k)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():  # warm-up outside capture (cuBLAS handles, kernels)
            for _ in range(2):
                y = static_x
                for k in range(steps):
                    y = one(k, y)
        torch.cuda.current_stream().wait_stream(side)
        per_step, outs = [], []
        with torch.no_grad():
            for k in range(steps):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    outs.append(one(k, static_x))
                per_step.append(graph)
            loop = torch.cuda.CUDAGraph()
            with torch.cuda.graph(loop, pool=self.pool):
                y = static_x
                for k in range(steps):
                    y = one(k, y)
        return {"x": static_x, "prefix": static_prefix, "steps": per_step, "step_out": outs, "loop": loop,
                "loop_out": y}

    def _load(self, graphs: dict[str, Any], x: torch.Tensor, prefix: torch.Tensor) -> None:
        graphs["x"].copy_(x)
        if prefix.data_ptr() != graphs["prefix"].data_ptr():
            graphs["prefix"].copy_(prefix)

    def step(self, x: torch.Tensor, prefix: torch.Tensor, k: int) -> torch.Tensor:
        """Euler step k (what `FlowNet.flow_step` computes under bf16 autocast)."""
        if not 0 <= k < self.model.cfg.denoise_steps:
            raise ValueError(f"flow step k={k} out of range 0..{self.model.cfg.denoise_steps - 1}")
        graphs = self._set(x, prefix)
        self._load(graphs, x, prefix)
        graphs["steps"][k].replay()
        return graphs["step_out"][k].clone()

    def loop(self, x: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
        """All denoising steps from x0 (what `FlowNet.mean_action` computes under bf16 autocast)."""
        graphs = self._set(x, prefix)
        self._load(graphs, x, prefix)
        graphs["loop"].replay()
        return graphs["loop_out"].clone()


class FlowPolicy:
    """Rollout copy of the policy. State object: `rollout_weights` (the parameters and their policy version).

    Extra keyword arguments (`layers`, `heads`, `expert_layers`, `obs_tokens`, `num_instructions`,
    `image_size`, `patch`, `init_log_std`, `noise_std`, ...) go to `FlowNetConfig`; the trainer must
    get the same ones. `row_block` (default: 64 on the CPU, off on CUDA) is the block size of the
    batch-invariant evaluation; `None` turns it off.

    Data parallel (`replicas: R`): replica r's `num_envs` rows are the global rows
    `[r * num_envs, (r + 1) * num_envs)` of an `R * num_envs` batch; noise and evaluation blocks are
    keyed by global rows, so the replicas act exactly as one policy over all rows would.
    """

    # load_weights takes the trainer's tensors on this policy's GPU when the trainer shares it: rose then
    # passes them by CUDA IPC (docs/components.md), not through host memory (0.93 -> 0.02 s on the H200)
    rose_device_inputs = ("load_weights",)

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        chunk: int,
        num_envs: int,
        hidden: int,
        denoise_steps: int,
        seed: int = 0,
        device: str = "cpu",
        image: bool = False,
        row_block: int | None | str = "auto",
        replica: int = 0,
        replicas: int = 1,
        cuda_graphs: bool = False,
        **model_kwargs: Any,
    ) -> None:
        self.cfg = FlowNetConfig(
            obs_dim=obs_dim, act_dim=act_dim, chunk=chunk, hidden=hidden, denoise_steps=denoise_steps,
            image=image, **model_kwargs,
        )
        self.num_envs = int(num_envs)
        self.replica_rows = ReplicaRows(self.num_envs, int(replica), int(replicas))
        self.seed = int(seed)
        self.device = torch.device(device)
        self.model: FlowNet = build_model(self.cfg, self.seed, self.device).eval()
        self.model.requires_grad_(False)
        if row_block == "auto":
            row_block = None if self.device.type == "cuda" else 64
        self.row_block = None if row_block is None else min(int(row_block), self.replica_rows.total)
        self.graphs = DenoiseGraphs(self.model) if cuda_graphs and self.device.type == "cuda" else None
        # weight loads so far: the policy version stamped on every sample (`head`'s `version`), against which
        # the trainer measures a sample's staleness in an asynchronous plan (PPOTrainer.version)
        self.version = 0

    # -- helpers ------------------------------------------------------------------------------
    def _rows(self, rows: slice | None, n: int) -> range:
        """The global rows of a call over this replica's `rows` (None = all of them)."""
        selected = resolve_rows(rows, self.num_envs)
        if len(selected) != n:
            raise ValueError(
                f"FlowPolicy: got {n} rows but rows={rows} covers {len(selected)} of num_envs={self.num_envs}"
            )
        return self.replica_rows.to_global(selected)

    def _noise(self, stream: str, it: int, ep: int, t: int, rows: slice | None, n: int) -> torch.Tensor:
        """Keyed per-row standard normal noise `[n, chunk, act_dim]` for these rows (by global row)."""
        selected = self._rows(rows, n)
        shape = (self.cfg.chunk, self.cfg.act_dim)
        return keyed_normal(shape, self.replica_rows.total, slice(selected.start, selected.stop), "flow-policy",
                            stream, self.seed, it, ep, t).to(self.device)

    # -- phases -------------------------------------------------------------------------------
    @torch.no_grad()
    def backbone(self, obs: Obs, it: int, ep: int, t: int, rows: slice | None = None) -> Record:
        """Prefix features of `obs` and the initial flow noise x (x0) of these rows."""
        obs = obs_to(obs, self.device)
        x0 = self.cfg.noise_std * self._noise("x0", it, ep, t, rows, obs_rows(obs))
        with autocast_for(self.device):
            prefix = blocked_apply(self.model.backbone, (obs,), self._rows(rows, obs_rows(obs)), self.row_block)
        return {"prefix": prefix, "x": x0}

    @torch.no_grad()
    def flow_step(self, x: torch.Tensor, prefix: torch.Tensor, k: int, rows: slice | None = None) -> Record:
        """Euler step number `k` (0..denoise_steps-1) of the action flow."""
        x, prefix, k = x.to(self.device), prefix.to(self.device), int(k)
        if self.graphs is not None:
            return {"x": self.graphs.step(x, prefix, k)}
        with autocast_for(self.device):
            x = blocked_apply(lambda x_, p_: self.model.flow_step(x_, p_, k), (x, prefix),
                              self._rows(rows, x.shape[0]), self.row_block)
        return {"x": x}

    @torch.no_grad()
    def head(
        self,
        x: torch.Tensor,
        prefix: torch.Tensor,
        it: int,
        ep: int,
        t: int,
        rows: slice | None = None,
        x0: torch.Tensor | None = None,
    ) -> Record:
        """Exploration noise on the flow output x -> action, its exact log-prob, and the value.

        Pass `x0` (the backbone's x) to have it returned alongside, so the phased path produces the
        same record as `act`.
        """
        mean = x.to(self.device).float()
        eps = self._noise("explore", it, ep, t, rows, mean.shape[0])
        action = mean + torch.exp(self.model.log_std.float()) * eps
        with autocast_for(self.device):
            value = blocked_apply(self.model.value, (prefix.to(self.device),), self._rows(rows, mean.shape[0]),
                                  self.row_block)
        out = {"action": action, "logp": self.model.log_prob(action, mean), "value": value,
               "version": torch.full((mean.shape[0],), self.version, dtype=torch.long)}
        if x0 is not None:
            out["x0"] = x0
        return out

    @torch.no_grad()
    def act(self, obs: Obs, it: int, ep: int, t: int, rows: slice | None = None) -> Record:
        """backbone -> flow_step x denoise_steps -> head, in one call. Returns action
        `[n, chunk, act_dim]`, logp `[n]`, value `[n]`, x0 `[n, chunk, act_dim]` and version `[n]` (the
        weight loads this policy has had: the policy version of the samples)."""
        first = self.backbone(obs, it, ep, t, rows)
        x, prefix = first["x"], first["prefix"]
        if self.graphs is not None:
            x = self.graphs.loop(x, prefix)
        else:
            for k in range(self.cfg.denoise_steps):
                x = self.flow_step(x, prefix, k, rows)["x"]
        return self.head(x, prefix, it, ep, t, rows, x0=first["x"])

    # -- weights / state --------------------------------------------------------------------
    def load_weights(self, w: dict[str, torch.Tensor]) -> None:
        """Refresh `rollout_weights` from a state dict or a part of one (`PPOTrainer.get_weights()["w"]`
        holds only what an update can change; the frozen rest is the same seeded build here). A name
        this policy does not have is an error, never ignored."""
        self._load(w)
        self.version += 1

    def _load(self, w: dict[str, torch.Tensor]) -> None:
        unexpected = self.model.load_state_dict(w, strict=False).unexpected_keys
        if unexpected:
            raise KeyError(f"FlowPolicy.load_weights: weights this policy does not have: {sorted(unexpected)[:5]}")

    @property
    def rollout_weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    @rollout_weights.setter
    def rollout_weights(self, value: dict[str, torch.Tensor]) -> None:
        """The parameters alone, not a weight sync: the version is unchanged."""
        self._load(value)

    def get_state(self, name: str) -> dict[str, Any]:
        """`rollout_weights`: the parameters and their policy version (the weight loads so far), which the
        trainer's staleness is measured against -- so a restore puts both back together."""
        if name != "rollout_weights":
            raise KeyError(f"FlowPolicy has no state object {name!r} (it owns 'rollout_weights')")
        return {"params": self.rollout_weights, "version": self.version}

    def set_state(self, name: str, value: dict[str, Any]) -> None:
        """A restore (a checkpoint, a recovery, a trial's snapshot), not a weight sync: the version is the one
        saved with the weights (a plain parameter dict, an older checkpoint's: 0, as the trainer's published
        count from one). Without it, a policy restarted alone would stamp version 0 on samples the trainer
        measures against its own count, and one that survived a restarted trainer the reverse."""
        if name != "rollout_weights":
            raise KeyError(f"FlowPolicy has no state object {name!r} (it owns 'rollout_weights')")
        params, version = (value["params"], value["version"]) if set(value) == {"params", "version"} else (value, 0)
        self.rollout_weights = params
        self.version = int(version)

    def pop_metrics(self) -> dict[str, float]:
        return {"action_std": float(torch.exp(self.model.log_std).mean())}
