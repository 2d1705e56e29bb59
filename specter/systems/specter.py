"""Specter (arXiv 2511.14102): speculative decoding with a quantized self-draft whose routing drives expert prefetch.

Each cycle: the draft (the target with INT4 experts, resident) proposes K tokens; its routing over the window, counted
per (layer, expert), plans which experts the verification will need, and the planner copies them in on the H2D stream
while the draft is still drafting. The target then verifies K+1 tokens in one pass, hot-first (resident and prefetched
experts compute at once, the rest stream in on demand); greedy acceptance commits the accepted proposals and the
target's own next token. Prefetched experts are protected from eviction until the verification ends.

The draft reads the target's committed KV and writes only its speculative positions (the artifact's design). The
`draft-kv=copied` ablation arm gives it a KV cache of its own instead, kept equal to the target's by a device copy of
the prompt's KV after prefill and of each verification's committed positions after it: the numerics are the same,
the device holds a second KV (fewer slots at a memory budget) and every cycle pays the copy.
"""

from __future__ import annotations

from specter.eviction import OPTION as REPLACEMENT
from specter.offload.work import Upstream
from specter.speculation.lookahead import Planner, PlannerState
from specter.systems.base import PromptContext, PromptResult, System
from specter.systems.decode import decode_speculatively

#: Specter's kernels and host reads as its artifact decodes at batch 1 (github.com/wwwwwf/specter_asplos at commit
#: 1cded55cbca9913e280e0da05f36708bcabfcbb1, eager, no CUDA graphs). Its Phi-3.5-MoE and Qwen1.5-MoE targets are the
#: stock transformers classes with its own MoE wrapper in place of the stock block (`initialization/target_builder.py`,
#: `build_model`); it has no Mixtral target, which is priced as its Phi path. Read at its DeepSeek-V2-Lite path:
#: - one routed expert 12 (`streamlined_execution_engine/expert_reorder.py` 426-480: the positions, the gather, three
#:   FP16 linears and the activation, the weight, the cast, `index_add_`), once per distinct expert a pass reaches,
#:   assumed the same in its Phi and Qwen wrappers;
#: - head 11 (the final norm 8, the LM head, a cast, the argmax; the per-position logit processing of
#:   `speculative_inference_controller/model_wrapper.py` 75-78 is left out);
#: - the draft's experts of one MoE layer 9, one fused path for all its routed experts (`kernels/`: the alignment 3, two
#:   Marlin GEMMs, the activation 2, the weight, the sum);
#: - host reads 1 a target MoE layer: the expert counts read to the host (`expert_reorder.py` 398);
#: - the attention block: the stock modules' (counted) in the Phi and Qwen paths; 80 (78 to 81) in its own DeepSeek
#:   code (`models/target/modeling_deepseek.py`: eager attention, norms, its gate 6, the wrapper's routing 366-398 and
#:   shared experts 5), where the inherited yarn rotary cache is rebuilt in every layer on every forward that grows the
#:   sequence: 24 launches more (one a pageable copy, a host read).
SPECTER_ARTIFACT = Upstream(
    expert=12, head=11, draft_experts=9, host_reads=1, sources=(
        "wwwwwf/specter_asplos 1cded55cbca9913e280e0da05f36708bcabfcbb1: initialization/target_builder.py "
        "(build_model), streamlined_execution_engine/expert_reorder.py 366-480, kernels/ (the fused Marlin MoE path)",),
    by_architecture=(("deepseek-v2-lite", Upstream(
        attention=104, expert=12, head=11, draft_experts=9, host_reads=2, sources=(
            "wwwwwf/specter_asplos 1cded55cbca9913e280e0da05f36708bcabfcbb1: models/target/modeling_deepseek.py "
            "(its own DeepSeek-V2 code, the yarn cache rebuilt in every layer), "
            "streamlined_execution_engine/expert_reorder.py 366-480, kernels/",))),))


class Specter(System):
    name = "specter"
    order, colour = 120, "#c44e52"
    upstream = SPECTER_ARTIFACT
    speculative = True
    prefetch_in_window = True
    options = {"serialize-demand": (bool, False, "ablation: a demand copy waits for the compute issued before it "
                                                 "(no hot-first overlap)"),
               "draft-kv": (str, "shared", "ablation: copied gives the draft a KV cache of its own, the target's KV "
                                           "copied into it after prefill and every verification (shared: the draft "
                                           "reads the target's, the paper's)", ("shared", "copied")),
               "bandwidth-estimate": (str, "all-copies", "what the adaptive planner's bandwidth estimate learns from: "
                                                         "all-copies (its own and the verifications' demand copies) "
                                                         "or prefetches (its own only, the artifact's: an estimate "
                                                         "that lands no copy in time never learns)",
                                      ("all-copies", "prefetches")),
               **REPLACEMENT}
    serialize_demand = False  # the options' values; subclasses with their own options keep these defaults
    draft_kv = "shared"
    bandwidth_estimate = "all-copies"

    @property
    def keeps_draft_kv(self) -> bool:
        return self.separate_draft or self.draft_kv == "copied"

    def after_verify(self, ctx: PromptContext, start: int, tokens: int, tag: str) -> None:
        if self.draft_kv == "copied":
            ctx.executor.copy_kv(start, tokens, tag)

    def forecast(self, ctx: PromptContext, window, k: int) -> list[dict[int, tuple[int, ...]]]:
        """The routes the prefetch plan counts, one per draft step: the draft's own (what Specter knows)."""
        return window.draft_routes[:k]

    def planner(self, ctx: PromptContext, k: int, state: PlannerState):
        """This window's prefetch planner (the lookahead analyzer's top-M plans, by `--prefetch` policy)."""
        return Planner(ctx.config.prefetch, k, ctx.executor, ctx.cache.slots_per_layer, state,
                       demand_copies=self.bandwidth_estimate == "all-copies")

    def run(self, ctx: PromptContext) -> PromptResult:
        result = self.prefill(ctx)
        if self.draft_kv == "copied":
            ctx.executor.copy_kv(0, len(ctx.trace.prompt), "prefill")
        ctx.executor.serialize_demand = self.serialize_demand
        return decode_speculatively(self, ctx, result)


class SpecterOracle(Specter):
    """Specter planning from the target's own routes of the verification instead of the draft's (the `oracle`
    experiment).

    Draft step i's forecast is the route the target takes at verification input i - 1 (the same token), with a share
    `noise` of its expert identities replaced by other experts drawn uniformly (seeded by the run's seed and the
    window's start), which bounds what a better predictor could buy: noise 0 is a perfect one.

    Live, the verification has not run when the draft steps are planned: the oracle replays the routes the recorded
    decode of the prompt took at that verification (the simulated twin's, memoized before the timed region; the live
    model computes the same tokens from the same prefix). A step the record cannot answer (the live decode has left
    the recorded one: another committed token or proposal at a near-tie, or no memoized window) is forecast from the
    draft's own routes, as Specter's; the record's `extra.oracle_replay` counts the windows replayed whole and the
    others."""

    name = "specter-oracle"
    order, colour = 110, "#dd8452"
    live_reads_recording = True
    options = {**Specter.options,
               "noise": (float, 0.0, "share of the target's expert identities replaced at random", (0.0, 1.0))}

    def forecast(self, ctx: PromptContext, window, k: int) -> list[dict[int, tuple[int, ...]]]:
        import random

        rng = random.Random(ctx.config.seed * 1_000_003 + window.start)
        experts = range(ctx.work.experts_per_layer)
        out = []
        for routes in self._verification(ctx, window, k):
            noisy = {}
            for layer, chosen in routes.items():
                kept = [e for e in chosen if rng.random() >= self.noise]
                pool = [e for e in experts if e not in chosen]
                replaced = rng.sample(pool, min(len(pool), len(chosen) - len(kept)))
                noisy[layer] = tuple(sorted(kept + replaced))
            out.append(noisy)
        return out

    @staticmethod
    def _verification(ctx: PromptContext, window, k: int) -> list[dict[int, tuple[int, ...]]]:
        """The target's routes at the window's first k verification inputs: the window's own, or live the recorded
        decode's where it is the same decode (else the draft's, counted in `ctx.extra['oracle_replay']`)."""
        if not ctx.executor.live:
            return window.verify_routes[:k]
        found = ctx.service.recorded_window(ctx.trace.prompt, ctx.config.max_new_tokens, window.start, k)
        same = found is not None and (found[0].tokens[: len(ctx.trace.tokens)] == ctx.trace.tokens
                                      and found[1].draft_tokens[: k - 1] == window.draft_tokens[: k - 1])
        ctx.extra.setdefault("_oracle_windows", {})[window.start] = same  # the window's last forecast decides
        return found[1].verify_routes[:k] if same else window.draft_routes[:k]

    def run(self, ctx: PromptContext) -> PromptResult:
        result = super().run(ctx)
        windows = ctx.extra.pop("_oracle_windows", None)
        if windows is not None:
            replayed = sum(windows.values())
            ctx.extra["oracle_replay"] = {"windows_replayed": replayed, "windows_from_draft": len(windows) - replayed}
        return result
