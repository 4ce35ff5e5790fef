"""``rose simulate``: one serving fleet under several lending policies, trace-driven (issue 24).

The simulator calls the pure functions the running system calls (``elastic_controller.planner.plan``,
``elastic_controller.pools.to_forecast``, ``elastic_controller.observe.planner_job``,
``elastic_controller.planner.without_reclaims``); it does no Kubernetes I/O. See ``docs/simulate.md``.
"""
