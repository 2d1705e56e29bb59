"""The numerics of a run: what the target and draft compute (the forward service), recorded once and replayed (memos),
and sampling. Every system reads its tokens, routes and draft windows from here; none computes them itself."""
