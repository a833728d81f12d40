"""One RL iteration of a plan as a Ray Compiled Graph (the Ray backend's `compile`).

Every call of the iteration is bound once, in program order, with the iteration number as the graph's
input, so that an iteration is one `execute(k)` with no per-call scheduling by the driver or by Ray's
scheduler. Beside the graph, `CompiledIteration` keeps what the backend needs to know about its call
sites: who reads each call's value (CUDA IPC goes only to readers on the producer's GPU,
`tensor_transport.ipc_sites`), which values the driver reads, and how often to look for overdue calls.
The backend owns the actors, the cache of compiled plans and the execution; this module only builds.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rose_dsl.ir import ExecutionNode, Workflow

from .schedule import Schedule, Step, replicated
from .worker import replica_name

__all__ = ["CompiledIteration", "compile_iteration", "bounded"]


@dataclass
class CompiledIteration:
    """A plan's compiled iteration and what is known about its call sites."""

    schedule: Schedule  # (held: its id is the plan's key while the graph lives)
    dag: Any
    site_of: dict[int, tuple[int, str]]  # id(graph node) -> (site, producing process)
    readers: dict[int, list[tuple[str, str]]]  # site -> (process, method) of each reading call
    to_driver: set[int]  # sites whose values the driver reads
    poll_s: float | None  # how often to look for overdue calls while an iteration runs (None: no node timeout)

    def device_sites(self, slot: Mapping[str, int | None], device_inputs: Mapping[str, set[str]]) -> dict[str, set[int]]:
        """The call sites (per producing process) whose CUDA tensors may go by IPC, given each process's GPU
        slot and the methods of each that take device tensors: `tensor_transport.ipc_sites` over who reads
        each call's value in the graph (a token input counts: Ray deserialises it too)."""
        from .tensor_transport import ipc_sites

        producer = {site: proc for site, proc in self.site_of.values()}
        return ipc_sites(producer, self.readers, self.to_driver, slot, device_inputs)

    def device_readers(self, slot: Mapping[str, int | None]) -> list[str]:
        """The GPU processes that read some call's value (they say which of their methods take device tensors)."""
        return sorted({r for reads in self.readers.values() for r, _ in reads if slot.get(r) is not None})

    def teardown(self, seconds: float = 30.0) -> None:
        bounded(self.dag.teardown, seconds)


def compile_iteration(schedule: Schedule, wf: Workflow, actors: Mapping[str, Any]) -> CompiledIteration:
    """One DAG node per call, bound in program order, compiled. A compiled graph runs each actor's calls in
    the order they were bound (Ray's rule: an edge from each compute to the actor's next), so a component
    still runs its calls in program order with no ordering inputs. Two exceptions: a call whose outputs
    nobody reads (yet) hands them to its component's next call, so that the graph's outputs are one call per
    component instead of every call without consumers; and a call without data inputs takes its component's
    previous call as one (Ray wants every node to lead back to the graph's input; a component's first call
    reads the input itself). `actors`: process name (`name#r`) -> actor handle."""
    from ray.dag import InputNode, MultiOutputNode

    from .recipe import K

    plan = id(schedule)
    last_on: dict[str, Any] = {}
    consumed: set[int] = set()
    nodes: list[Any] = []
    # who reads each call's value (for CUDA IPC between processes on one GPU: `CompiledIteration.device_sites`)
    site_of: dict[int, tuple[int, str]] = {}
    readers: dict[int, list[tuple[str, str]]] = {}
    with InputNode() as inp:
        def bind(step: Step, replica: int = 0) -> Sequence[Any]:
            unique: list[Any] = []
            index: dict[int, int] = {}
            ports = []
            for h in step.handles:
                key = id(h.node)
                if key not in index:
                    index[key] = len(unique)
                    unique.append(h.node)
                ports.append((index[key], -1 if h.whole else h.index))
                consumed.add(key)
            comp = replica_name(step.node.component, replica)
            previous = last_on.get(comp)
            # an `after:` is an input nobody reads (it carries the earlier call's outputs to this process)
            tokens = list({id(h.node): h.node for h in step.after if id(h.node) not in index}.values())
            # (a call without inputs also needs one: every graph node must lead back to the graph's input)
            if previous is not None and (id(previous) not in consumed or not (unique or tokens)):
                tokens += [] if any(t is previous for t in tokens) else [previous]
            consumed.update(id(t) for t in tokens)
            # only a component's first call reads the iteration number from the graph's input; its later
            # calls (in order, in the same process) reuse it -- one reader of the input per actor
            k_arg = inp if previous is None else None
            site = len(nodes)
            node = actors[comp].call_compiled.bind(plan, step.node.path, step.recipe, step.inv.indices,
                                                   tuple(ports), site, k_arg, *unique, *tokens)
            method = step.node.method
            for read in (*unique, *tokens):  # a token is deserialised by its reader too
                readers.setdefault(site_of[id(read)][0], []).append((comp, method))
            site_of[id(node)] = (site, comp)
            last_on[comp] = node
            nodes.append(node)
            whole = len(step.node.outputs) <= 1  # such a call returns its value, not a 1-tuple (cheaper)
            return tuple(_Port(node, i, whole) for i in range(max(1, len(step.node.outputs))))

        replicas = max((c.replicas for c in wf.components.values()), default=1)
        schedule.steps(K, bind if replicas == 1 else replicated(bind, wf))
        leaves = [n for n in nodes if id(n) not in consumed]
        to_driver = {site_of[id(n)][0] for n in leaves}
        out = MultiOutputNode(leaves)
    dag = out.experimental_compile()
    limits = [n.timeout_s for n in schedule.workflow.items() if isinstance(n, ExecutionNode) and n.timeout_s]
    # a node's timeout_s is watched by asking the workers for an overdue call, ten times per limit
    poll_s = min(1.0, max(0.02, min(limits) / 10)) if limits else None
    return CompiledIteration(schedule, dag, site_of, readers, to_driver, poll_s)


def bounded(fn: Any, seconds: float) -> None:
    """Run a teardown step, giving up on it (it runs on in a daemon thread) after `seconds`."""

    def run() -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - a teardown after the run's outcome is decided (e.g. of a graph whose actors
            pass  # were killed after a watchdog, which raises): its failure must not replace that outcome

    t = threading.Thread(target=run, name="rose-teardown", daemon=True)
    t.start()
    t.join(seconds)


class _Port:
    """Output `index` of a compiled-graph node (`whole`: the node's value is that one output)."""

    __slots__ = ("node", "index", "whole")

    def __init__(self, node: Any, index: int, whole: bool) -> None:
        self.node, self.index, self.whole = node, index, whole
