"""The one package every ROSE component may import; it imports none of them.

Holds what the components share: API names (``names``, ``extender_names``), the ResourceSlice
shape (``slices``), the predictor's wire models (``forecast_api``) and its client
(``forecast_client``), Event helpers (``events``), structured logging (``logs``), flags with
environment twins (``cli``), atomic file writes (``atomic``), Kubernetes quantities
(``quantity``), Prometheus text parsing (``promtext``), the generated protobuf stubs (``proto``),
and the Kubernetes kernel: the API client factory, raw JSON transport, typed errors and object
views (``kube``), list-then-watch (``informer``, lines parsed by ``kwatch``) and a keyed work
queue (``workqueue``).
"""
