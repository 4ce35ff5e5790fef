"""rose_sdk integrations with training frameworks, each imported on its own (``import rose_sdk``
imports none of them, nor their frameworks).

``rose_sdk.integrations.transformers``: a Transformers ``Trainer`` (and every TRL trainer built
on it, ``GRPOTrainer`` included) on ROSE — ``pip install 'rose-sdk[transformers]'``.

``rose_sdk.integrations.rollout``: the rollout-engine protocol (sleep / wake / load weights /
generate) and its suspend / resume through the node agent; engines in ``transformers_generate``,
``vllm`` and ``sglang``. ``rose_sdk.integrations.ray``: a Ray actor on a lent GPU, registered with
its pod's node agent.
"""
