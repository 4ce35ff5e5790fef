"""The Kubernetes kernel every component shares: one API client factory and raw JSON transport
(:mod:`.client`), typed API errors (:mod:`.errors`) and typed views of raw objects
(:mod:`.objects`). Only :mod:`.client` does I/O; the other two are pure."""
