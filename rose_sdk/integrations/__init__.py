"""rose_sdk integrations with training frameworks, each imported on its own (``import rose_sdk``
imports none of them, nor their frameworks).

``rose_sdk.integrations.transformers``: a Transformers ``Trainer`` (and every TRL trainer built
on it, ``GRPOTrainer`` included) on ROSE — ``pip install 'rose-sdk[transformers]'``.
"""
