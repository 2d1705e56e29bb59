"""What speculative systems decide: the lookahead analyzer and prefetch planner, and the governor that picks K."""
