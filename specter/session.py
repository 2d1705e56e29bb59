"""A `Session` owns what one process has loaded: targets, their forward services, drafts, model hashes, the memos read
into the services, the pinned host expert stores of GPU runs, and the kernels live runs' twins are priced at.

Every run, compare and sweep in a process shares one session, so that a second system, budget or hardware profile on the
same prompts pays only for scheduling. Nothing here is module state: a new `Session()` starts from nothing (tests make
one to stand for a new process).
"""

from __future__ import annotations

from pathlib import Path

import torch


def _key(path: str | Path) -> str:
    return str(Path(path).resolve())


class Session:
    def __init__(self) -> None:
        self._targets: dict[tuple[str, str], tuple[object, object]] = {}  # (model dir, dtype) -> (MoEModel, service)
        self._drafts: dict[tuple, tuple[object, str]] = {}  # (draft dir, dtype, packed) -> (Draft, content key)
        self._hashes: dict[str, str] = {}
        self._memos: set[tuple[str, str, str]] = set()  # (model dir, dtype, memo file) already read
        self._stores: dict[tuple, object] = {}  # (model dir, dtype) -> ExpertStore
        self._architectures: dict[str, tuple[object, object]] = {}  # --cost-as -> (Architecture, its ModelWork)
        self._tokenizers: dict[str, object] = {}  # model dir -> its tokenizer
        self._calibration: dict[tuple, list[list[int]]] = {}  # (model dir, corpus, count, length) -> prompts
        self.structures: dict[tuple, tuple[int, ...]] = {}  # runs.checks.resolve's --cost-as structures
        self.counted: dict[tuple, object] = {}  # (model, dtype, draft, live draft kernel, device) -> its DecodeOps

    def calibration_prompts(self, model_dir: str | Path, corpus: str, count: int, length: int) -> list[list[int]]:
        """`count` prompts of `length` tokens from a corpus's calibration split, through the model's tokenizer
        (`calibration_token_ids`), kept: every run with a governor or warm-up of a sweep asks again (tokenizing the
        stream takes about half a second)."""
        from specter.data.corpus import calibration_token_ids

        key = (_key(model_dir), corpus, count, length)
        if key not in self._calibration:
            self._calibration[key] = calibration_token_ids(self.tokenizer(model_dir), corpus, count, length)
        return [list(p) for p in self._calibration[key]]

    def tokenizer(self, model_dir: str | Path):
        """The checkpoint's tokenizer, loaded once (a sweep's every run reads its prompts through it)."""
        from specter.models.loading import load_tokenizer

        key = _key(model_dir)
        if key not in self._tokenizers:
            self._tokenizers[key] = load_tokenizer(model_dir)
        return self._tokenizers[key]

    def model_hash(self, model_dir: str | Path) -> str:
        """The model hash (config and weights) of a checkpoint, computed once."""
        from specter.models.integrity import model_hash

        key = _key(model_dir)
        if key not in self._hashes:
            self._hashes[key] = model_hash(model_dir)
        return self._hashes[key]

    def numerics(self, model_dir: str | Path, draft_dir: str | Path | None = None, memos: tuple[str, ...] = (),
                 dtype: str = "float32", stream: bool = False, packed_draft: bool = False, experts_on: str = "memory"):
        """(target, draft or None, ForwardService) for this model at `dtype`: the target loaded once per dtype, its
        service memoizing the target's numerics for every system and each draft's windows separately (keyed by the
        draft's content), starting from the recorded `memos`. The service's current draft becomes `draft_dir`'s.
        `stream`: a target not loaded yet is read tensor by tensor into its place, its experts as the rows a host
        store adopts (`specter.models.streaming`; a checkpoint it cannot read so loads through transformers).
        `packed_draft`: the draft keeps its codes and dequantizes on each call (`load_draft`; no dense copy).
        `experts_on`: where a streamed target's experts live (memory, disk or auto: `stream_moe_model`)."""
        from specter.models.loading import load_moe_model
        from specter.models.streaming import StreamingUnsupported, stream_moe_model
        from specter.numerics.forward import ForwardService
        from specter.numerics.memo import draft_key, load_memo
        from specter.quant.draft import load_draft

        key = _key(model_dir)
        if (key, dtype) not in self._targets:
            target = None
            if stream:
                try:
                    target = stream_moe_model(model_dir, getattr(torch, dtype), known_hash=self.model_hash(model_dir),
                                              experts_on=experts_on)
                except StreamingUnsupported:
                    target = None
            if target is None:
                target = load_moe_model(model_dir, dtype=getattr(torch, dtype), known_hash=self.model_hash(model_dir))
            self._targets[key, dtype] = (target, ForwardService(target))
        target, service = self._targets[key, dtype]
        for memo in memos:
            if (key, dtype, _key(memo)) not in self._memos:
                load_memo(service, memo, self.model_hash(model_dir))
                self._memos.add((key, dtype, _key(memo)))
        draft = None
        if draft_dir is not None:
            path = (_key(draft_dir), dtype, packed_draft)  # dequantized to the target's dtype
            if path not in self._drafts:
                loaded = load_draft(target, draft_dir, target_hash=self.model_hash(model_dir), packed=packed_draft)
                self._drafts[path] = (loaded, draft_key(draft_dir))
            draft, content_key = self._drafts[path]
            service.draft, service.draft_key = draft.moe, content_key
        return target, draft, service

    def service(self, model_dir: str | Path, dtype: str = "float32"):
        """The forward service of a model the session has loaded."""
        return self.numerics(model_dir, dtype=dtype)[2]

    def architecture(self, name_or_path: str):
        """(Architecture, its ModelWork) of a `--cost-as` value, built once (on the meta device)."""
        from specter.models.architectures import load_architecture
        from specter.offload.work import ModelWork

        if name_or_path not in self._architectures:
            arch = load_architecture(name_or_path)
            self._architectures[name_or_path] = (arch, ModelWork.of(arch.meta_model()))
        return self._architectures[name_or_path]

    def expert_store(self, model_dir: str | Path, target, pin: bool, dtype=None, share: bool = False):
        """The target's routed experts in host memory (pinned on CUDA), built once per dtype (None: the store's
        FP16); `share`: the target's experts become views into it (`ExpertStore`)."""
        from specter.offload.store import WEIGHT_DTYPE, ExpertStore

        dtype = dtype or WEIGHT_DTYPE
        key = (_key(model_dir), dtype)
        if key not in self._stores:
            self._stores[key] = ExpertStore(target, pin=pin, dtype=dtype, share=share)
        elif pin:
            self._stores[key].pin()
        return self._stores[key]
