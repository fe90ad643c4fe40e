"""FLy inside vLLM: a ``vllm.general_plugins`` plugin that applies loosespec's acceptance rule to vLLM's
speculative-decoding verification (LOSSY when enabled).

- :mod:`loosespec.integrations.vllm.rule`: the adapter from vLLM's flattened tensors (``cu_num_draft_tokens``,
  ``-1`` padding) to :mod:`loosespec.verify.fly`, importable without vLLM.
- :mod:`loosespec.integrations.vllm.plugin`: the entry point vLLM calls in each of its processes; it wraps
  vLLM's ``rejection_sample`` when ``LOOSESPEC_REJECTION_SAMPLE_METHOD=fly``, unless that vLLM has FLy natively.
- :mod:`loosespec.integrations.vllm.native`: whether a vLLM has FLy natively (its ``SpeculativeConfig``'s fields:
  vLLM 0.33.0 and later), and loosespec's FLy knobs as vLLM's native ``speculative_config`` keys.

Configuration (environment, read in every vLLM process; the names are vLLM's ``speculative_config``
names from the upstream FLy pull request, upper-cased and prefixed)::

    LOOSESPEC_REJECTION_SAMPLE_METHOD=fly   # unset or "standard": vLLM's own rule, untouched
    LOOSESPEC_FLY_WINDOW_SIZE=6
    LOOSESPEC_FLY_ENTROPY_THRESHOLD=0.3
    LOOSESPEC_FLY_ENTROPY_TOP_K=3
    LOOSESPEC_FLY_STATS_FILE=/path/counters.json   # optional: FLy's counters, rewritten at most twice a second
"""
