"""What makes the paper-shaped (>300M-parameter) policy and its update affordable, checked on tiny sizes:
micro-batched gradient accumulation gives the minibatch's gradient, a frozen backbone bottom stays fixed
and keeps no optimizer state, `values="rollout"` is standard PPO's value source, and the CUDA-graph
denoising loop replays what the eager loop computes (GPU only)."""

from __future__ import annotations

import pytest
import torch

from examples.embodied.policy import FlowPolicy
from examples.embodied.ppo import PPOTrainer

SIZES = dict(obs_dim=10, act_dim=2, chunk=2, hidden=32, denoise_steps=2, layers=3, heads=4)
T, N = 3, 8


def _traj(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    done = (torch.rand(T, N, generator=g) < 0.3).float()
    return {"obs": torch.randn(T, N, 10, generator=g), "next_obs": torch.randn(T, N, 10, generator=g),
            "x0": torch.randn(T, N, 2, 2, generator=g), "action": torch.randn(T, N, 2, 2, generator=g),
            "logp": torch.randn(T, N, generator=g) - 3, "reward": torch.randn(T, N, generator=g), "done": done}




def _trained(traj: dict[str, torch.Tensor], updates: int = 2, **kw) -> dict[str, torch.Tensor]:
    trainer = PPOTrainer(**SIZES, lr=1e-3, ppo_epochs=2, minibatches=2, **kw)
    for _ in range(updates):
        trainer.update(traj)
    return trainer.get_state("weights")


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_micro_batches_accumulate_the_minibatch_gradient() -> None:
    traj = _traj()
    whole = _trained(traj)
    for micro in (1, 5, 12):  # 12 rows per minibatch: micro-batches of 1, 5 (uneven) and all
        assert _max_diff(_trained(traj, micro_batch=micro), whole) < 1e-5
    assert _max_diff(_trained(traj, micro_batch=5), _trained(_traj(1))) > 1e-3  # it does train on the data


def test_frozen_backbone_bottom_stays_fixed_and_has_no_optimizer_state() -> None:
    trainer = PPOTrainer(**SIZES, lr=1e-2, ppo_epochs=1, minibatches=1, trainable_blocks=1)
    before = trainer.get_state("weights")
    trainer.update(_traj())
    after = trainer.get_state("weights")
    frozen = [k for k in before if k.startswith(("blocks.0.", "blocks.1.", "proprio.", "pos"))]
    trained = [k for k in before if k.startswith(("blocks.2.", "expert.", "act_in.", "value_head."))]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)
    assert any(not torch.equal(before[k], after[k]) for k in trained)
    held = {id(p) for group in trainer.opt.param_groups for p in group["params"]}
    assert all(id(p) not in held for p in trainer.model.blocks[0].parameters())
    everything = PPOTrainer(**SIZES, lr=1e-3, trainable_blocks=-1)  # -1: train every block
    assert all(p.requires_grad for p in everything.model.parameters())


def test_published_weights_are_what_an_update_changes_and_refresh_the_whole_policy() -> None:
    """get_weights leaves out the frozen blocks (the 4-s weight-sync gap on the H200); a policy built
    from the same config and seed ends up with exactly the trainer's full state after load_weights."""
    trainer = PPOTrainer(**SIZES, lr=1e-2, ppo_epochs=1, minibatches=1, trainable_blocks=1)
    trainer.update(_traj())
    published = trainer.get_weights()["w"]
    full = trainer.get_state("weights")
    assert not any(k.startswith(("blocks.0.", "blocks.1.")) for k in published)
    assert any(k.startswith("blocks.2.") for k in published) and len(published) < len(full)
    policy = FlowPolicy(SIZES["obs_dim"], SIZES["act_dim"], SIZES["chunk"], N, SIZES["hidden"],
                        SIZES["denoise_steps"], layers=SIZES["layers"], heads=SIZES["heads"])
    policy.load_weights(published)
    mine = policy.rollout_weights
    assert mine.keys() == full.keys() and all(torch.equal(mine[k], full[k]) for k in full)
    with pytest.raises(KeyError, match="does not have"):
        policy.load_weights({**published, "not.a.weight": torch.zeros(1)})
    everything = PPOTrainer(**SIZES, lr=1e-3, trainable_blocks=-1)
    assert everything.get_weights()["w"].keys() == everything.get_state("weights").keys()


def test_rollout_values_are_the_recomputed_ones_when_the_rollout_used_these_weights() -> None:
    """values="rollout" takes V(obs) from the trajectory and evaluates only the bootstrap observations;
    given the values the rollout policy (same weights) computed, the update equals the recomputing one."""
    traj = _traj()
    traj["next_obs"][:-1] = torch.where(traj["done"][:-1, :, None].bool(), traj["next_obs"][:-1], traj["obs"][1:])
    probe = PPOTrainer(**SIZES, lr=1e-3)
    traj["value"] = probe._values(traj["obs"])
    recompute = _trained(traj, updates=1)  # one update: the critic's weights are still the rollout's
    rollout = _trained(traj, updates=1, values="rollout")
    assert _max_diff(recompute, rollout) < 1e-5
    assert _max_diff(rollout, _trained({**traj, "value": traj["value"] + 1.0}, updates=1, values="rollout")) > 1e-4
    with pytest.raises(KeyError, match="lacks 'value'"):
        PPOTrainer(**SIZES, lr=1e-3, values="rollout").update({k: v for k, v in traj.items() if k != "value"})
    with pytest.raises(ValueError, match="values must be"):
        PPOTrainer(**SIZES, lr=1e-3, values="both")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (run on the GPU machine)")
def test_cuda_graph_denoising_replays_the_eager_loop() -> None:
    kw = dict(obs_dim=10, act_dim=2, chunk=4, num_envs=16, hidden=64, denoise_steps=3, layers=2, heads=4,
              device="cuda")
    eager, graphed = FlowPolicy(**kw), FlowPolicy(**kw, cuda_graphs=True)
    obs = torch.randn(16, 10)
    for rows in (None, slice(0, 8)):
        o = obs if rows is None else obs[rows]
        a, b = eager.act(o, 1, 0, 2, rows), graphed.act(o, 1, 0, 2, rows)
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-3)
    graphed.load_weights({k: v * 1.01 for k, v in eager.rollout_weights.items()})  # in place: graphs stay valid
    eager.load_weights({k: v * 1.01 for k, v in eager.rollout_weights.items()})
    torch.testing.assert_close(eager.act(obs, 0, 0, 0)["action"], graphed.act(obs, 0, 0, 0)["action"],
                               rtol=1e-3, atol=1e-3)


def test_frozen_stem_is_computed_once_per_update_and_changes_nothing() -> None:
    """The PPO epochs reuse the frozen part's output (same weights, same rows) instead of recomputing it."""
    from examples.embodied.model import FlowNet

    traj = _traj()
    reuse = PPOTrainer(**SIZES, lr=1e-3, ppo_epochs=3, minibatches=2, trainable_blocks=1)
    again = PPOTrainer(**SIZES, lr=1e-3, ppo_epochs=3, minibatches=2, trainable_blocks=1)
    calls: dict[str, int] = {"reuse": 0, "again": 0}
    for name, trainer in (("reuse", reuse), ("again", again)):
        original = trainer.model.stem
        trainer.model.stem = lambda obs, name=name, original=original: (calls.__setitem__(name, calls[name] + 1),
                                                                        original(obs))[1]
    again.model.evaluate = lambda obs, x0, action, stem=None: FlowNet.evaluate(again.model, obs, x0, action)
    reuse.update(traj)
    again.update(traj)
    # two critic passes (obs, next_obs), then once for all 3 epochs x 2 minibatches -- not once per minibatch
    assert calls == {"reuse": 3, "again": 3 + 6}  # the copy that ignores the cache recomputes per minibatch
    assert _max_diff(reuse.get_state("weights"), again.get_state("weights")) < 1e-5


def test_the_paper_image_configuration_starts_its_update_at_ratio_one() -> None:
    """The paper workloads' policy shape (camera patches + proprio tokens, a frozen backbone bottom,
    rollout values): at the rollout weights the trainer's log-probs and values are the rollout's, so PPO's
    first ratio is exactly 1 and any KL an update reports is the update's own step (the H200 Meta-World
    runs reported approx_kl 6-96 per update: step size, not a mismatch)."""
    common = dict(obs_dim=39, act_dim=4, chunk=8, hidden=64, denoise_steps=3, layers=4, heads=4, expert_layers=1,
                  obs_tokens=4, image=True, image_size=32, patch=8)
    n, steps = 8, 3
    policy = FlowPolicy(num_envs=n, seed=0, **common)
    trainer = PPOTrainer(seed=0, lr=5e-4, ppo_epochs=2, minibatches=4, trainable_blocks=2, values="rollout", **common)
    g = torch.Generator().manual_seed(1)
    obs = [{"state": torch.randn(n, 39, generator=g),
            "image": torch.randint(0, 255, (n, 3, 32, 32), dtype=torch.uint8, generator=g)} for _ in range(steps)]
    outs = [policy.act(obs=o, it=0, ep=0, t=t) for t, o in enumerate(obs)]
    cat = {k: torch.cat([o[k] for o in outs]) for k in ("x0", "action", "logp", "value")}
    with torch.no_grad():
        logp, value = trainer.model.evaluate({k: torch.cat([o[k] for o in obs]) for k in ("state", "image")},
                                             cat["x0"], cat["action"])
    torch.testing.assert_close(logp, cat["logp"], atol=1e-5, rtol=0)
    torch.testing.assert_close(value, cat["value"], atol=1e-5, rtol=0)
    assert float(cat["logp"].abs().mean()) > 1.0  # (log-probs of 32 action numbers: a mismatch would show)
