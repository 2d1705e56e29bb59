"""The numerics of a proxy model seen through an architecture's layers (`--cost-as`).

`MappedService` wraps a run's `ForwardService`: every trace, draft window and sampled cycle it hands out has its routes
re-keyed by the architecture's MoE layers (`LayerMap`), so every system, planner, bound and governor of the run works
in the architecture's layer indices while the tokens and routing decisions stay the proxy's. The wrapped service still
computes and memoizes everything (memos are the proxy's, unmapped). A recorder's extra values are re-keyed by the
recorder itself (`TraceRecorder.remap`), since only it knows what its keys mean.
"""

from __future__ import annotations

from specter.numerics.forward import DraftWindow, PromptTrace, WindowPath


class MappedService:
    def __init__(self, inner, layer_map) -> None:
        self.inner = inner
        self.layer_map = layer_map
        self._sources: dict[int, PromptTrace] = {}  # id(mapped) -> source
        self._windows: dict[int, tuple[DraftWindow, DraftWindow]] = {}

    # what a service exposes ----------------------------------------------------------------------------------------
    @property
    def target(self):
        return self.inner.target

    @property
    def draft(self):
        return self.inner.draft

    @property
    def forward_calls(self) -> int:
        return self.inner.forward_calls

    def require(self, recorders) -> None:
        self.inner.require(recorders)

    def trace(self, prompt: list[int], max_new_tokens: int, calibration: bool = False) -> PromptTrace:
        return self._map_trace(self.inner.trace(prompt, max_new_tokens, calibration))

    def sampled_trace(self, prompt: list[int], max_new_tokens: int, temperature: float, seed: int) -> PromptTrace:
        return self._map_trace(self.inner.sampled_trace(prompt, max_new_tokens, temperature, seed))

    def window(self, trace: PromptTrace, t: int, k: int, own_kv: bool = False) -> DraftWindow:
        return self._map_window(self.inner.window(self._sources[id(trace)], t, k, own_kv))

    def windows(self, requests: list[tuple[PromptTrace, int, int]], own_kv: bool = False) -> list[DraftWindow]:
        inner = [(self._sources[id(trace)], t, k) for trace, t, k in requests]
        return [self._map_window(w) for w in self.inner.windows(inner, own_kv)]

    def recorded_window(self, prompt: list[int], max_new_tokens: int, t: int,
                        k: int) -> tuple[PromptTrace, DraftWindow] | None:
        found = self.inner.recorded_window(prompt, max_new_tokens, t, k)
        return None if found is None else (self._map_trace(found[0]), self._map_window(found[1]))

    def source(self, trace: PromptTrace) -> PromptTrace:
        """The proxy's own trace behind a mapped one."""
        return self._sources[id(trace)]

    def walk(self, paths: list[WindowPath], own_kv: bool = False) -> None:
        """The paths walked over the proxy's own traces (a window's acceptance does not depend on the layers)."""
        for path in paths:
            path.trace = self.source(path.trace)
        self.inner.walk(paths, own_kv)

    def sampling_session(self, prompt: list[int], temperature: float, seed: int):
        return _MappedSampling(self.inner.sampling_session(prompt, temperature, seed), self)

    # mapping ---------------------------------------------------------------------------------------------------------
    def _map_trace(self, trace: PromptTrace) -> PromptTrace:
        """The trace re-keyed by the architecture's layers, derived once per trace, layer map and set of recorded
        extras (`PromptTrace.derive`), so every run of a sweep at the same architecture reuses it."""
        extras = tuple(sorted(name for name in trace.extras if name in self.inner.recorders))

        def mapped_trace(source: PromptTrace) -> PromptTrace:
            routes = self.layer_map.routes
            return PromptTrace(list(source.prompt), list(source.tokens), [routes(r) for r in source.prefill_routes],
                               [routes(r) for r in source.step_routes],
                               {name: self.inner.recorders[name].remap(source.extras[name], self.layer_map)
                                for name in extras}, calibration=source.calibration, origin=source.origin)

        mapped = trace.derive(("mapped", self.layer_map, extras), mapped_trace)
        self._sources[id(mapped)] = trace
        return mapped

    def _map_window(self, window: DraftWindow) -> DraftWindow:
        cached = self._windows.get(id(window))
        if cached is not None and cached[0] is window:
            return cached[1]
        routes = self.layer_map.routes
        mapped = DraftWindow(window.start, window.draft_tokens, [routes(r) for r in window.draft_routes],
                             window.verify_argmax, [routes(r) for r in window.verify_routes])
        self._windows[id(window)] = (window, mapped)
        return mapped


class _MappedSampling:
    """A sampling session whose cycles' windows are re-keyed by the architecture's layers."""

    def __init__(self, session, service: MappedService) -> None:
        self.session, self.service = session, service

    def cycle(self, k: int):
        window, accepted, committed = self.session.cycle(k)
        return self.service._map_window(window), accepted, committed
