"""The one package every ROSE component may import; it imports none of them.

Holds what the components share: API names (``names``, ``extender_names``), the ResourceSlice
shape (``slices``), the predictor's wire models (``forecast_api``) and its client
(``forecast_client``), Kubernetes watch-line parsing (``kwatch``), Event helpers (``events``),
structured logging (``logs``), flags with environment twins (``cli``), atomic file writes
(``atomic``), Kubernetes quantities (``quantity``), Prometheus text parsing (``promtext``) and
the generated protobuf stubs (``proto``).
"""
