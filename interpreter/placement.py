"""Which GPU each GPU process of a workflow runs on (the Ray backend reserves one placement-group bundle
per slot and starts each process on its slot)."""

from __future__ import annotations

from dataclasses import dataclass

from rose_dsl.ir import Workflow

from .worker import component_of, replica_name

__all__ = ["GpuPlacement"]


@dataclass(frozen=True)
class GpuPlacement:
    """Which GPU slot each GPU process runs on: replica r of a component on slot `gpu + r` (`gpu`
    defaults to 0). All components on the same slots is the colocated mode; components on disjoint
    slots (e.g. the simulator on `gpu: 0`, policy and trainer on `gpu: ${replicas}`) the disaggregated
    one. Slots are the bundles of one placement group, i.e. distinct physical GPUs."""

    slot_of: dict[str, int]  # process name (`name#r`) -> slot

    @classmethod
    def of(cls, wf: Workflow) -> GpuPlacement:
        return cls({replica_name(name, r): (comp.gpu or 0) + r
                    for name, comp in wf.components.items() if comp.device == "gpu"
                    for r in range(comp.replicas)})

    @property
    def slots(self) -> int:
        return max(self.slot_of.values(), default=-1) + 1

    def slot(self, component: str, replica: int) -> int | None:
        return self.slot_of.get(replica_name(component, replica))

    def share(self, slot: int) -> float:
        """Each process's part of its slot's bundle (Ray's fractional GPU): the bundle keeps room for one
        process more, which a process moved to another MPS quota takes while the one it replaces is parked
        (`actor_moves.py`)."""
        return 1.0 / (sum(1 for s in self.slot_of.values() if s == slot) + 1)

    def distinct(self, component: str) -> bool:
        """Do the component's replicas run on distinct GPUs (what NCCL requires)?"""
        mine = [s for p, s in self.slot_of.items() if component_of(p) == component]
        return len(set(mine)) == len(mine)

    def describe(self) -> str:
        by_slot: dict[int, list[str]] = {}
        for process, slot in sorted(self.slot_of.items(), key=lambda kv: kv[1]):
            by_slot.setdefault(slot, []).append(process)
        return "; ".join(f"GPU {s}: {', '.join(ps)}" for s, ps in by_slot.items())
